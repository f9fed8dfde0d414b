"""NCCLSettings: NCCL environment variables, validated against NCCL's documented values."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from lit_compute._validate import check_dataclass

ALGOS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
PROTOS = ("ll", "ll128", "simple")
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
DEBUG_SUBSYS = (
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "ALL",
)
# Deprecated or removed variables -> what to use instead.
DEPRECATED = {
    "NCCL_MIN_NCHANNELS": "NCCL_MIN_CTAS (NCCLSettings.min_ctas)",
    "NCCL_MAX_NCHANNELS": "NCCL_MAX_CTAS (NCCLSettings.max_ctas)",
    "NCCL_LL_THRESHOLD": "NCCL_PROTO (NCCLSettings.proto)",
    "NCCL_LL128_THRESHOLD": "NCCL_PROTO (NCCLSettings.proto)",
    "NCCL_TREE_THRESHOLD": "NCCL_ALGO (NCCLSettings.algo)",
    "NCCL_SINGLE_RING_THRESHOLD": "NCCL_ALGO (NCCLSettings.algo)",
}
_FIELD_VARS = {
    "algo": "NCCL_ALGO",
    "proto": "NCCL_PROTO",
    "socket_nthreads": "NCCL_SOCKET_NTHREADS",
    "nsocks_perthread": "NCCL_NSOCKS_PERTHREAD",
    "buffsize": "NCCL_BUFFSIZE",
    "ib_disable": "NCCL_IB_DISABLE",
    "p2p_level": "NCCL_P2P_LEVEL",
    "min_ctas": "NCCL_MIN_CTAS",
    "max_ctas": "NCCL_MAX_CTAS",
    "debug": "NCCL_DEBUG",
    "debug_subsys": "NCCL_DEBUG_SUBSYS",
}


def _check_token_list(var: str, value: str, tokens: tuple[str, ...]) -> None:
    """``tok[,tok...]`` or ``^tok[,tok...]`` (exclusion), case-insensitive."""
    body = value[1:] if value.startswith("^") else value
    items = [t.strip().lower() for t in body.split(",")]
    bad = [t for t in items if t not in tokens]
    if not body or bad:
        raise ValueError(
            f"NCCLSettings: {var}={value!r} has unknown token(s) {bad or [body]}; accepted: a comma list of "
            f"{', '.join(tokens)} (case-insensitive), '^' in front to exclude them, or per collective "
            f"'allreduce:tree,ring;broadcast:ring'"
        )


def _check_algo_or_proto(var: str, value: str, tokens: tuple[str, ...]) -> None:
    if ":" not in value:
        _check_token_list(var, value, tokens)
        return
    for part in filter(None, (p.strip() for p in value.split(";"))):
        collective, _, spec = part.partition(":")
        if collective.strip().lower() not in COLLECTIVES:
            raise ValueError(
                f"NCCLSettings: {var}={value!r} names an unknown collective {collective.strip()!r}; accepted: "
                f"{', '.join(COLLECTIVES)}"
            )
        _check_token_list(var, spec.strip(), tokens)


@dataclass
class NCCLSettings:
    """NCCL environment variables, validated at construction against NCCL's documented values.

    Each field maps to one variable (``algo`` -> ``NCCL_ALGO`` ...); ``None`` leaves it unset. ``extra`` sets any
    other ``NCCL_*`` variable verbatim. Errors name the variable, the value and what is accepted.

    Args:
        algo: ``NCCL_ALGO``: comma list of Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT; ``^`` to
            exclude; or per collective, ``"allreduce:tree,ring;broadcast:ring"``.
        proto: ``NCCL_PROTO``: LL, LL128, Simple (same grammar).
        socket_nthreads: ``NCCL_SOCKET_NTHREADS``, 1-16.
        nsocks_perthread: ``NCCL_NSOCKS_PERTHREAD``, 1-64; ``socket_nthreads * nsocks_perthread`` must be <= 64
            (NCCL clamps it silently otherwise).
        buffsize: ``NCCL_BUFFSIZE`` in bytes; a power of two (others warn).
        ib_disable: ``NCCL_IB_DISABLE``.
        p2p_level: ``NCCL_P2P_LEVEL``: LOC, NVL, PIX, PXB, PHB, SYS.
        min_ctas: ``NCCL_MIN_CTAS``, 1-64.
        max_ctas: ``NCCL_MAX_CTAS``, 1-64, >= ``min_ctas``.
        debug: ``NCCL_DEBUG``: VERSION, WARN, INFO, TRACE.
        debug_subsys: ``NCCL_DEBUG_SUBSYS``: comma list of INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, ALLOC,
            CALL, PROXY, NVLS, BOOTSTRAP, REG, PROFILE, RAS, ALL (``^`` to exclude).
        extra: Other ``NCCL_*`` variables.

    Example:
        >>> NCCLSettings(algo="Tree", socket_nthreads=4, nsocks_perthread=4).env()["NCCL_ALGO"]
        'Tree'
    """

    algo: str | None = None
    proto: str | None = None
    socket_nthreads: int | None = None
    nsocks_perthread: int | None = None
    buffsize: int | None = None
    ib_disable: bool | None = None
    p2p_level: str | None = None
    min_ctas: int | None = None
    max_ctas: int | None = None
    debug: str | None = None
    debug_subsys: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_dataclass(self)  # types first: NCCLSettings(socket_nthreads=4.7) is refused, not exported as "4.7"
        if self.algo is not None:
            _check_algo_or_proto("NCCL_ALGO", self.algo, ALGOS)
        if self.proto is not None:
            _check_algo_or_proto("NCCL_PROTO", self.proto, PROTOS)
        for name, lo, hi in (
            ("socket_nthreads", 1, 16),
            ("nsocks_perthread", 1, 64),
            ("min_ctas", 1, 64),
            ("max_ctas", 1, 64),
        ):
            value = getattr(self, name)
            if value is not None and not lo <= int(value) <= hi:
                raise ValueError(f"NCCLSettings: {_FIELD_VARS[name]}={value} is out of range; accepted: {lo}..{hi}")
        if self.socket_nthreads and self.nsocks_perthread and self.socket_nthreads * self.nsocks_perthread > 64:
            raise ValueError(
                f"NCCLSettings: NCCL_SOCKET_NTHREADS={self.socket_nthreads} x NCCL_NSOCKS_PERTHREAD="
                f"{self.nsocks_perthread} = {self.socket_nthreads * self.nsocks_perthread} exceeds 64, which NCCL "
                "silently clamps; lower one of them (e.g. 4 x 4 or 8 x 8)"
            )
        if self.min_ctas and self.max_ctas and self.min_ctas > self.max_ctas:
            raise ValueError(f"NCCLSettings: NCCL_MIN_CTAS={self.min_ctas} is above NCCL_MAX_CTAS={self.max_ctas}")
        if self.buffsize is not None:
            if self.buffsize <= 0:
                raise ValueError(f"NCCLSettings: NCCL_BUFFSIZE={self.buffsize} must be a positive number of bytes")
            if self.buffsize & (self.buffsize - 1):
                warnings.warn(
                    f"NCCLSettings: NCCL_BUFFSIZE={self.buffsize} is not a power of two (NCCL's default is "
                    "4194304 = 4 MiB); use one",
                    UserWarning,
                    stacklevel=3,
                )
        if self.p2p_level is not None and str(self.p2p_level).upper() not in P2P_LEVELS:
            raise ValueError(
                f"NCCLSettings: NCCL_P2P_LEVEL={self.p2p_level!r} is unknown; accepted: {', '.join(P2P_LEVELS)}"
            )
        if self.debug is not None and str(self.debug).upper() not in DEBUG_LEVELS:
            raise ValueError(f"NCCLSettings: NCCL_DEBUG={self.debug!r} is unknown; accepted: {', '.join(DEBUG_LEVELS)}")
        if self.debug_subsys is not None:
            body = self.debug_subsys[1:] if self.debug_subsys.startswith("^") else self.debug_subsys
            bad = [t for t in (x.strip().upper() for x in body.split(",")) if t not in DEBUG_SUBSYS]
            if bad:
                raise ValueError(
                    f"NCCLSettings: NCCL_DEBUG_SUBSYS={self.debug_subsys!r} has unknown {bad}; accepted: "
                    f"{', '.join(DEBUG_SUBSYS)} ('^' to exclude)"
                )
        for key, value in self.extra.items():
            if not re.fullmatch(r"NCCL_[A-Z0-9_]+", key):
                raise ValueError(
                    f"NCCLSettings: extra key {key!r} is not an NCCL variable; keys must start with 'NCCL_'"
                )
            if key in _FIELD_VARS.values():
                field_name = next(k for k, v in _FIELD_VARS.items() if v == key)
                raise ValueError(f"NCCLSettings: extra[{key!r}]={value!r}: use the field {field_name}= instead")
            if key in DEPRECATED:
                warnings.warn(
                    f"NCCLSettings: {key} is deprecated or removed in current NCCL; use {DEPRECATED[key]}",
                    UserWarning,
                    stacklevel=3,
                )

    def env(self) -> dict[str, str]:
        """The variables to set, as strings."""
        out: dict[str, str] = {}
        for name, var in _FIELD_VARS.items():
            value = getattr(self, name)
            if value is None:
                continue
            out[var] = str(int(value)) if isinstance(value, bool) else str(value)
        out.update({k: str(v) for k, v in self.extra.items()})
        return out
