"""Where step time goes, what the devices do, and a Prometheus endpoint for the same metrics."""

from lit_compute.monitoring.device_monitor import DeviceMonitor
from lit_compute.monitoring.prometheus_logger import PrometheusLogger, prometheus_name
from lit_compute.monitoring.step_time_monitor import StepTimeMonitor, input_bound_advice

__all__ = ["DeviceMonitor", "PrometheusLogger", "StepTimeMonitor", "input_bound_advice", "prometheus_name"]
