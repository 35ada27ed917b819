"""A search space from the overrides a user types, in Hydra's grammar as its Optuna sweeper reads it.

``'train.lr=tag(log, interval(1e-4, 3e-3))'`` is a float drawn on a log scale between the two bounds (both
included), ``'train.warmup_steps=range(0, 200, 50)'`` an integer from the points range() enumerates (0, 50,
100, 150: the same points a grid sweep ``-m`` takes, so the end is excluded, unlike Hydra's Optuna sweeper),
``choice(a, b)`` or ``a,b`` one of the values. Whether a drawn value is an integer follows the setting's type
in the schema, not how its bounds were written (Hydra reads every interval bound as a float).

Before anything is submitted, a run is composed at every corner of the space (each parameter at its bounds,
every value of a choice, in every combination: :meth:`Space.corners`), so each value is checked as a single
run's would be, and the run fits its GPUs and cluster wherever the search may go.
"""
from __future__ import annotations

import itertools
import typing
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.compose.catalog import GROUPS
from launcher.compose.runfile import hydra_value, key_of
from launcher.compose.schema import field_type
from launcher.errors import LaunchError

SEARCH = "search"  # the config group that asks for a search, and the prefix of its settings
FLOAT, INT, CHOICE = "float", "int", "choice"
MAX_CORNERS = 256  # compositions checked before a launch: a few seconds
_LOG = "log"


@dataclass(frozen=True)
class Param:
    """One searched setting: a number between ``low`` and ``high`` (on a ``step`` grid, on a log scale), or one
    of ``choices``."""

    key: str
    kind: str  # FLOAT, INT or CHOICE
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None
    log: bool = False
    choices: Tuple[Any, ...] = ()

    def extremes(self) -> List[Any]:
        """The values a corner takes: both bounds, or every choice."""
        return list(self.choices) if self.kind == CHOICE else list(dict.fromkeys([self.low, self.high]))

    def distribution(self) -> Any:
        """Optuna's distribution of this parameter."""
        # lazy: keeps optuna out of start-up
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == CHOICE:
            return CategoricalDistribution(list(self.choices))
        if self.kind == INT:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def domain(self) -> str:
        """The values this parameter takes, as a reader says them."""
        if self.kind == CHOICE:
            return "one of " + ", ".join(map(str, self.choices))
        grid = f" in steps of {self.step:g}" if self.step else ""
        return f"{self.kind} from {self.low:g} to {self.high:g}{grid}" + (" (log scale)" if self.log else "")

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is one this parameter can take (a number in the bounds, on the step grid)."""
        if self.kind == CHOICE:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            return False
        if self.kind == INT and value != int(value):
            return False
        return not self.step or abs((value - self.low) / self.step - round((value - self.low) / self.step)) < 1e-9

    def line(self, value: Any) -> str:
        """The override that sets this parameter to ``value``."""
        return f"{self.key}={hydra_value(value)}"

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Param":
        return cls(**{**data, "choices": tuple(data.get("choices") or ())})


@dataclass(frozen=True)
class Space:
    """What a search launch typed, sorted: the parameters searched, the overrides every trial shares, and the
    search's own settings (``search=optuna``, ``search.trials=24``, ...), which no trial composes with."""

    params: Tuple[Param, ...]
    fixed: Tuple[str, ...]
    settings: Tuple[str, ...]

    def trial(self, values: Dict[str, Any]) -> List[str]:
        """A trial's overrides: the shared ones, then each parameter at its value."""
        return [*self.fixed, *(param.line(values[param.key]) for param in self.params)]

    def corners(self) -> List[Dict[str, Any]]:
        """Every combination of every parameter's extremes (a run is composed at each before the launch)."""
        axes = [param.extremes() for param in self.params]
        count = 1
        for axis in axes:
            count *= len(axis)
        if count > MAX_CORNERS:
            raise LaunchError(f"the search space has {count} corners to check before submitting (at most "
                              f"{MAX_CORNERS}); search fewer choices at once")
        return [dict(zip((p.key for p in self.params), point)) for point in itertools.product(*axes)]


def checked_point(space: Space, point: Any) -> Dict[str, Any]:
    """A point of ``search.enqueue`` as a trial's values: every key a parameter of the space and every value one
    it can take (a one-line LaunchError otherwise); a parameter it leaves out, which Optuna will draw, at its
    lower extreme, for the launch's check of the run there."""
    params = {param.key: param for param in space.params}
    if not isinstance(point, dict) or not point:
        raise LaunchError(f"search.enqueue takes points such as {{{space.params[0].key}: VALUE}}, got {point!r}")
    for key, value in point.items():
        if key not in params:
            raise LaunchError(f"search.enqueue: {key} is not a parameter of the search (its parameters: "
                              f"{', '.join(params)})")
        if not params[key].holds(value):
            raise LaunchError(f"search.enqueue: {key}={value!r} is outside the space ({params[key].domain()})")
    return {key: point.get(key, param.extremes()[0]) for key, param in params.items()}


def asked(overrides: Sequence[str]) -> bool:
    """Whether the overrides ask for a search (``search=`` an option other than none); a search setting without
    one is an error, since a single run or a grid would ignore it."""
    choices = [line.split("=", 1)[1].strip("'\"") for line in overrides
               if key_of(line) == SEARCH and "=" in line and not line.startswith("~")]
    if choices and choices[-1] != "none":
        return True
    settings = [line for line in overrides if key_of(line).startswith(f"{SEARCH}.")]
    if settings:
        raise LaunchError(f"'{settings[0]}' is a search setting; add search=optuna (and -m) to search")
    return False


def read_space(overrides: Sequence[str]) -> Space:
    """Sort a search launch's overrides into parameters, shared overrides and search settings; a one-line
    LaunchError for a sweep the search cannot draw from, or a search without a parameter."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # lazy: keeps hydra out of start-up
    from hydra.errors import HydraException  # lazy: keeps hydra out of start-up

    parser = OverridesParser.create()
    params, fixed, settings = [], [], []
    for line in overrides:
        key = key_of(line)
        if key == SEARCH or key.startswith(f"{SEARCH}."):
            settings.append(line)
            continue
        try:
            override = parser.parse_override(line)
        except HydraException as exc:
            raise LaunchError(f"cannot parse override {line!r}: {str(exc).splitlines()[0]}") from None
        if override.is_sweep_override():
            params.append(param_of(override, line))
        else:
            fixed.append(line)
    if not params:
        raise LaunchError("search=optuna needs a setting to search, e.g. 'train.lr=tag(log, interval(1e-4, 3e-3))' "
                          "or 'train.warmup_steps=range(0, 200, 50)'")
    return Space(tuple(params), tuple(fixed), tuple(settings))


def param_of(override: Any, line: str) -> Param:
    """The parameter an interval(), range() or choice() override (optionally in tag(log, ...)) describes."""
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep  # lazy: keeps hydra

    key, sweep = override.get_key_element(), override.value()
    if isinstance(sweep, Glob):
        raise LaunchError(f"'{line}': glob() cannot be searched; name the options, e.g. {key}=choice(a, b)")
    tags = set(getattr(sweep, "tags", ()) or ())
    if tags - {_LOG}:
        raise LaunchError(f"'{line}': a search reads only the tag log, as in tag(log, interval(1e-4, 3e-3)); "
                          f"got {', '.join(sorted(tags - {_LOG}))}")
    log = _LOG in tags
    if isinstance(sweep, ChoiceSweep):
        if log:
            raise LaunchError(f"'{line}': tag(log, ...) applies to interval() only")
        return Param(key, CHOICE, choices=tuple(sweep.list))
    if key in GROUPS:
        raise LaunchError(f"'{line}': a config group is searched over choices, e.g. {key}=choice(a, b)")
    kind = number_kind(key, line)
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if not low < high:
            raise LaunchError(f"'{line}': interval(low, high) needs low < high, got {low:g} and {high:g}")
        if log and low <= 0:
            raise LaunchError(f"'{line}': tag(log, ...) needs a positive lower bound, got {low:g}")
        if kind == INT:
            if low != int(low) or high != int(high):
                raise LaunchError(f"'{line}': {key} is an integer setting; give interval() integer bounds")
            return Param(key, INT, int(low), int(high), log=log)
        return Param(key, FLOAT, float(low), float(high), log=log)
    if isinstance(sweep, RangeSweep):
        if log:
            raise LaunchError(f"'{line}': tag(log, ...) applies to interval() only; a range() has its own step")
        if sweep.shuffle:
            raise LaunchError(f"'{line}': a search draws its own order; drop shuffle()")
        values = list(override.sweep_iterator())
        if not values:
            raise LaunchError(f"'{line}': the range holds no value")
        if kind == INT and not all(isinstance(v, int) for v in values):
            raise LaunchError(f"'{line}': {key} is an integer setting; give range() integer start, stop and step")
        if len(values) == 1:
            return Param(key, CHOICE, choices=tuple(values))
        if kind == INT:
            return Param(key, INT, values[0], values[-1], step=values[1] - values[0])
        return Param(key, FLOAT, float(values[0]), float(values[-1]), step=float(sweep.step))
    raise LaunchError(f"'{line}' cannot be searched; use interval(), range(), choice() or a,b")


def number_kind(key: str, line: str) -> str:
    """INT or FLOAT, as the schema types ``key``; a LaunchError for a key that holds no number."""
    kind, free = field_type(key)
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    kind = args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind
    if kind is int:
        return INT
    if kind is float or free or kind is Any:
        return FLOAT
    raise LaunchError(f"'{line}': {key} holds no number; search it over choices, e.g. {key}=choice(a, b)")


def to_dict(space: Space) -> Dict[str, Any]:
    return {"params": [asdict(p) for p in space.params], "fixed": list(space.fixed), "settings": list(space.settings)}


def from_dict(data: Dict[str, Any]) -> Space:
    return Space(tuple(Param.from_dict(p) for p in data["params"]), tuple(data["fixed"]), tuple(data["settings"]))
