"""The configs shipped inside the package: ``lit-compute fit --config quickstart`` trains one, ``lit-compute init
quickstart`` copies one to edit. A ``pip install`` user has no repository, so these are the configs the docs name.

Floor 0: no torch, no Lightning, nothing of lit_compute's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
#: The Grafana dashboard of PrometheusLogger's series (``lit-compute init grafana`` copies it out to import)
DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "grafana.json"


def packaged_configs() -> dict[str, Path]:
    """Each packaged config by its name (the file name without ``.yaml``)."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def packaged_files() -> dict[str, Path]:
    """What ``lit-compute init`` copies out: each packaged config, and the Grafana dashboard as ``grafana``."""
    return {**packaged_configs(), "grafana": DASHBOARD}


def describe(path: Path) -> str:
    """A config's first comment line (what it trains), a dashboard's description, for listings."""
    if path.suffix == ".json":
        import json

        return str(json.loads(path.read_text()).get("description", "")).split(":")[0]
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def resolve_config(value: str) -> str:
    """``value`` as given when it names a file; a packaged config's path when it is one's name (``quickstart`` or
    ``quickstart.yaml``). Anything else is returned unchanged, for the parser to refuse with its own message."""
    if Path(value).exists() or "/" in value or "\n" in value or ":" in value:
        return value
    name = value[:-5] if value.endswith(".yaml") else value
    return str(packaged_configs()[name]) if name in packaged_configs() else value


def unknown_config_message(value: str) -> str | None:
    """The one-line error for ``--config VALUE`` naming neither a file nor a packaged config (``None`` when it names
    one, or when it is inline YAML for the parser)."""
    if Path(value).exists() or "\n" in value or ":" in value or resolve_config(value) != value:
        return None
    names = ", ".join(packaged_configs())
    return (
        f"--config {value}: no such file, and no packaged config of that name; give a path to a YAML file, or "
        f"one of the packaged configs: {names} (lit-compute init NAME copies one to edit)"
    )


def resolve_config_args(args: list[str]) -> list[str]:
    """``args`` with each ``--config``/``-c`` value that names a packaged config replaced by its path."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config(arg.split("=", 1)[1])
    return out


def first_unknown_config(args: list[str]) -> str | None:
    """The error for the first ``--config`` value that names nothing, or ``None``."""
    for i, arg in enumerate(args):
        value = (
            args[i + 1]
            if arg in ("--config", "-c") and i + 1 < len(args)
            else (arg.split("=", 1)[1] if arg.startswith("--config=") else None)
        )
        if value is not None and (message := unknown_config_message(value)):
            return message
    return None


def init_main(argv: list[str]) -> int:
    """``lit-compute init [NAME] [--out FILE]``: list the packaged configs and the Grafana dashboard, or copy one to
    FILE to edit (``init grafana``: the dashboard's JSON, to import into Grafana)."""
    parser = argparse.ArgumentParser(
        prog="lit-compute init",
        description="Copy a packaged config to edit, or the Grafana dashboard to import (without NAME: list them).",
    )
    parser.add_argument("name", nargs="?", help="one of: " + ", ".join(packaged_files()))
    parser.add_argument(
        "--out", default=None, help="where to write it (default: NAME.yaml here; lit_compute_grafana.json)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE when it exists")
    args = parser.parse_args(argv)
    configs = packaged_files()
    if args.name is None:
        width = max(len(n) for n in configs)
        sys.stdout.write("".join(f"  {n:<{width}}  {describe(p)}\n" for n, p in configs.items()))
        return 0
    name = args.name[:-5] if args.name.endswith(".yaml") else args.name
    if name not in configs:
        sys.stderr.write(
            f"lit-compute init: error: no packaged config or dashboard {args.name!r}; choose one of "
            f"{', '.join(configs)}\n"
        )
        return 2
    source = configs[name]
    out = Path(args.out or ("lit_compute_grafana.json" if source == DASHBOARD else f"{name}.yaml"))
    if out.exists() and not args.force:
        sys.stderr.write(f"lit-compute init: error: {out} exists; choose another --out or add --force\n")
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, out)
    if source == DASHBOARD:
        sys.stdout.write(
            f"wrote {out} (the packaged Grafana dashboard); import it in Grafana (Dashboards > New > Import) and pick "
            "the Prometheus data source that scrapes PrometheusLogger (docs/monitoring.md)\n"
        )
        return 0
    sys.stdout.write(f"wrote {out} (from the packaged {name}.yaml); train it with: lit-compute fit --config {out}\n")
    return 0
