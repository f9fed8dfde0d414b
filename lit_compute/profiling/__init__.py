"""ProfilerWindow (torch.profiler over chosen step windows), trace summaries and profile_model."""

from lit_compute.profiling.profile_model import ModelProfile, profile_model
from lit_compute.profiling.profiler_window import ProfilerWindow
from lit_compute.profiling.trace_summary import WindowSummary, summarize_trace

__all__ = ["ModelProfile", "ProfilerWindow", "WindowSummary", "profile_model", "summarize_trace"]
