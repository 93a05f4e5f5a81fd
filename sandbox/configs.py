"""Config dataclasses -> command lines and config files, one line per setting.

A run's settings are one dataclass whose fields are declared with :func:`arg`::

    @dataclass
    class TrainConfig:
        model: str = arg("tiny", "HF model id, local dir, or an alias")
        steps: int = arg(100, "rollout + update steps")
        report_to: list[str] = arg([], "tensorboard and/or wandb")

:func:`add_arguments` turns the fields into argparse flags (``--report-to``; booleans as
``--flag/--no-flag``; ``dict`` fields as ``key=value`` pairs; ``choices`` checked by argparse),
each help text followed by its default once. :func:`parse_config` adds ``--config FILE``
(``.yaml``/``.yml`` read with ``yaml.safe_load``, ``.toml`` with ``tomllib``): the file sets the
same fields by name (``report_to: [tensorboard]``), and flags given on the command line override
it. An unknown key or a value of the wrong type is a ``ValueError`` naming it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import math
import numbers
import os
import pathlib
import re
import tomllib
import types
import typing
from typing import Any

_MISSING = dataclasses.MISSING


def arg(default: Any, help: str, *, choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with its help text (and choices) on one line; mutable defaults are
    copied per instance."""
    metadata = {"help": help, "choices": choices}
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_help(cls: type) -> dict[str, str]:
    """Field name -> help text of a config dataclass (its CLI is generated from these)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def built_objective(config: Any) -> Any:
    """``config.objective`` with ``config.objective_params``, built through the registry once per
    config object (again only if those fields change): the config's check and its trainer share
    one build."""
    from sandbox.objectives import get_objective

    key = (config.objective, repr(sorted(config.objective_params.items())))
    built = config.__dict__.get("_built_objective")
    if built is None or built[0] != key:
        built = (key, get_objective(config.objective, **config.objective_params))
        config.__dict__["_built_objective"] = built
    return built[1]


def check_int(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer >= ``low`` (numpy integers too, not bools),
    else a one-line ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_number(
    name: str, value: Any, *, above: float | None = 0, what: str = "a number", text: bool = False
) -> float:
    """``value`` as a ``float`` if it is a finite real number (not a bool) > ``above`` (None: no
    bound), else a one-line ``ValueError`` naming ``name``: ``{name} must be {what} > {above},
    got {value!r}``. ``text``: a string is read as a number first (a flag, an environment
    variable, an old record), and the message quotes the string as given."""
    number = value
    if text and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
    if (
        isinstance(number, bool)
        or not isinstance(number, numbers.Real)
        or not math.isfinite(number)
        or (above is not None and number <= above)
    ):
        bound = "" if above is None else f" > {above:g}"
        raise ValueError(f"{name} must be {what}{bound}, got {value!r}")
    return float(number)


#: Advantages that compare a sample with the rest of its group: a group of one is an error.
GROUP_RELATIVE = ("grpo", "rloo")


def check_group_size(
    advantage: str, group_size: int, names: tuple[str, str] = ("group_size", "advantage")
) -> None:
    """A ``ValueError`` when ``advantage`` needs groups of two or more and ``group_size`` < 2;
    ``names``: how the caller spells the two settings (``("--group-size", "--advantage")``)."""
    if advantage in GROUP_RELATIVE and group_size < 2:
        raise ValueError(f"{names[0]} must be >= 2 for {names[1]} {advantage}, got {group_size}")


def flag(name: str) -> str:
    """``field_name`` -> ``--field-name``."""
    return "--" + name.replace("_", "-")


#: A negative number as a command-line value: argparse's own pattern (``-1``, ``-.5``, ``-1.5``)
#: and scientific notation (``-1e-3``, ``-2.5E+2``), which argparse takes for a flag.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class CommandParser(argparse.ArgumentParser):
    """The parser of every command line of the project (``python -m llm.train``, ``llm.claims``,
    ``clip-sandbox``, ...): argparse's, with two defaults changed. No abbreviations
    (``allow_abbrev=False``): a prefix of a flag is an unrecognized argument, not that flag
    (``llm.ensemble --seed 3`` was taken for ``--seeds 3``). A negative number in scientific
    notation is a value (:data:`NEGATIVE_NUMBER`): ``--lr -1e-3`` reaches the command's own
    check ("--lr must be > 0") instead of argparse's "expected one argument". Sub-commands
    (``add_subparsers``) are built with the same class."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--workers 0`` is an error, not a silent default)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def check_device(value: str, name: str = "device") -> str:
    """``value`` if torch can place tensors there on this machine (``cpu``, ``cuda``,
    ``cuda:N``), else a one-line ``ValueError`` naming the flag."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"{flag(name)} must be cpu, cuda or cuda:N, got {value!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag(name)} must be cpu, cuda or cuda:N, got {value!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{flag(name)} {value}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{flag(name)} {value}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return value


def literal(text: str) -> Any:
    """A command-line value as a Python literal (numbers, lists, True/None), else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def key_values(items: list[str], name: str) -> dict[str, Any]:
    """``["a=1", "b-c=x"]`` -> ``{"a": 1, "b_c": "x"}``; ``ValueError`` naming ``name``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{name} takes key=value pairs, got {item!r}")
        out[key.replace("-", "_")] = literal(value)
    return out


def _without_none(kind: Any) -> Any:
    """``list[int] | None`` -> ``list[int]``."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def base_type(kind: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` -> ``list``."""
    kind = _without_none(kind)
    return typing.get_origin(kind) or kind


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not _MISSING else f.default


def _help(f: dataclasses.Field, default: Any, shown: str | None = None) -> str:
    text = f.metadata.get("help", "")
    if shown is not None:
        return f"{text} (default: {shown})"
    if default is None or default in ([], {}) or isinstance(default, bool):
        return text  # booleans show as --x/--no-x; None/empty: the help text says what happens
    return f"{text} (default: {default})"


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    extra_help: dict[str, str] | None = None,
    unset: bool = False,
    shown: dict[str, str] | None = None,
    metavars: dict[str, str] | None = None,
    choices: dict[str, tuple[Any, ...]] | None = None,
    skip: tuple[str, ...] = (),
    prefix: str = "",
    check_choices: bool = True,
) -> None:
    """One flag per field of dataclass ``cls`` (but ``skip``), each default shown once.

    ``extra_help`` appends text to a field's help; ``unset``: every flag defaults to None, so only
    what the command line gives is set and the caller fills in the rest (e.g. defaults that
    depend on another setting), lists then take one or more values; ``shown``: the default to
    print for a field instead of its own; ``metavars`` / ``choices`` per field (choices also come
    from :func:`arg`; ``check_choices=False``: left to the caller's own check). A list's items
    take the list's item type (``list[float]``: floats). ``prefix``: the flags are
    ``--PREFIX-field`` (dest ``PREFIX_field``, read back by :func:`flag_values`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, default = base_type(hints[f.name]), _default(f)
        help_ = _help(f, default, (shown or {}).get(f.name)) + (extra_help or {}).get(f.name, "")
        kw: dict[str, Any] = {"help": help_, "default": None if unset else default}
        if metavars and f.name in metavars:
            kw["metavar"] = metavars[f.name]
        option = flag(prefix + f.name)
        if kind is bool:
            parser.add_argument(option, action=argparse.BooleanOptionalAction, **kw)
        elif kind in (list, dict):
            item = typing.get_args(_without_none(hints[f.name]))[:1]
            if kind is list and item and item[0] in (int, float, str):
                kw["type"] = item[0]
            parser.add_argument(option, nargs="+" if unset else "*", **kw)
        else:
            options = (choices or {}).get(f.name) or f.metadata.get("choices")
            if options and check_choices:
                kw.update(choices=options)
                kw.pop("metavar", None)
            parser.add_argument(option, type=kind, **kw)


def flag_values(args: argparse.Namespace, cls: type, prefix: str = "") -> dict[str, Any]:
    """The values of :func:`add_arguments`' flags for dataclass ``cls`` (with its ``prefix``) in
    ``args``, by field name (a field without a flag left out); a ``dict`` field's ``key=value``
    pairs read by :func:`key_values`."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, prefix + f.name):
            value = getattr(args, prefix + f.name)
            if base_type(hints[f.name]) is dict and isinstance(value, list):
                value = key_values(value, flag(prefix + f.name))
            out[f.name] = value
    return out


_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def add_study_arguments(
    parser: argparse.ArgumentParser, profiles: dict[str, Any], study: str, committed: str
) -> None:
    """The flags every study's CLI shares (``python -m llm.claims`` today):
    ``--out`` (default ``runs/STUDY-PROFILE``: a default run never writes into the committed
    evidence, ``committed``), ``--force``, ``--profile``, ``--quick``, ``--no-progress`` and
    ``--tables-only``. :func:`profile_settings` reads them back."""
    parser.add_argument(
        "--out",
        default=None,
        help=f"output folder (default: runs/{study}-PROFILE; the committed study is {committed}, "
        "rebuilt with --tables-only)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="recompute this command's runs (their parts in the folder are replaced)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(profiles),
        default="cpu",
        help="named settings (default: cpu); flags override them",
    )
    parser.add_argument("--quick", action="store_true", help="= --profile quick")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="run nothing: rebuild the tables and figures from OUT/parts (llm.claims: only the "
        "parts of the calibrated point recorded in OUT/config.json; other parts are left out, "
        "never mixed in)",
    )


def profile_settings(
    args: argparse.Namespace, cls: type, profiles: dict[str, Any], study: str
) -> dict[str, Any]:
    """The settings of the chosen profile (``--quick``: ``quick``) with every field of ``cls``
    given on the command line replacing the profile's; sets ``args.out`` to its default
    ``runs/STUDY-PROFILE`` when unset (:func:`add_study_arguments`)."""
    profile = "quick" if args.quick else args.profile
    args.out = args.out or f"runs/{study}-{profile}"
    settings = dict(profiles[profile])
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
    settings.update({name: value for name, value in given.items() if value is not None})
    return settings


def _yaml_floats(value: Any) -> Any:
    """PyYAML (YAML 1.1) reads ``1e-4`` as a string; read it as the float it means."""
    if isinstance(value, str) and _FLOAT.match(value):
        return float(value)
    if isinstance(value, list):
        return [_yaml_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_floats(v) for k, v in value.items()}
    return value


def read_mapping(path: str | os.PathLike[str], what: str = "config file") -> dict[str, Any]:
    """The mapping in a ``.toml``, ``.yaml`` or ``.yml`` file (``yaml.safe_load``, ``tomllib``);
    ``ValueError`` naming the file for a missing file, bad syntax or a non-mapping."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"{what} not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = _yaml_floats(yaml.safe_load(path.read_text()))
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: invalid YAML: {exc}") from None
    else:
        raise ValueError(f"{what} {path}: expected a .toml, .yaml or .yml file")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a {what} is a mapping of keys, got {type(data).__name__}")
    return data


def load_file(path: str, cls: type) -> dict[str, Any]:
    """The settings in a YAML or TOML file, checked against the fields of ``cls``."""
    data = read_mapping(path)
    return check_types({k.replace("-", "_"): v for k, v in data.items()}, cls, f"--config {path}")


def check_types(values: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    """``values`` if every key is a field of ``cls`` with a value of the field's type."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            raise ValueError(f"{where}: unknown setting {key!r}; settings: {', '.join(names)}")
        kind = base_type(hints[key])
        ok = value is None or (
            isinstance(value, int | float) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        )
        if not ok:
            raise ValueError(f"{where}: {key} must be {kind.__name__}, got {value!r}")
    return values


def parse_config(
    cls: type,
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    extra_help: dict[str, str] | None = None,
) -> Any:
    """An instance of dataclass ``cls`` from ``--config FILE`` and command-line flags (flags win).
    ``dict`` fields take ``key=value`` pairs on the command line."""
    pre = CommandParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    parser = CommandParser(prog=prog, description=description)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or TOML file of settings; flags given here override it",
    )
    add_arguments(parser, cls, extra_help=extra_help)
    if known.config:
        parser.set_defaults(**load_file(known.config, cls))
    return cls(**flag_values(parser.parse_args(argv), cls))


def check_keys(
    where: str, given: typing.Iterable[str], valid: typing.Iterable[str], what: str = "key"
) -> None:
    """A one-line ``ValueError`` if ``given`` holds names not in ``valid``:
    ``WHERE: unknown key(s) ['x']; valid keys: [...]`` (``what`` replaces ``key``; an empty
    ``where`` drops its prefix)."""
    valid = list(valid)
    if unknown := sorted(set(given) - set(valid)):
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}unknown {what}(s) {unknown}; valid {what}s: {valid}")
