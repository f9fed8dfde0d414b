import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_count_flops_example_runs(capsys):
    runpy.run_path(str(EXAMPLES / "count_flops.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "ViT-B/16, batch 8: forward 281.0 GFLOPs" in out
    assert "at 100% MFU" in out


def test_profile_example_runs(capsys):
    runpy.run_path(str(EXAMPLES / "profile_one_inference.py"), run_name="__main__")
    assert "aten::" in capsys.readouterr().out
