"""Flat Optuna parameter names <-> ``ArchConfig`` layers: the one place the naming scheme lives.

A trial's params are the per-layer fields, named with the vocabulary's field names::

    L{i}.attention  L{i}.mlp_ratio  L{i}.g{j}.count  L{i}.g{j}.qk_dim  L{i}.g{j}.v_dim
    L{i}.g{j}.kv_heads                                          (only when grouped)
    L{i}.role  L{i}.freeze_mlp  L{i}.eta  L{i}.tied_output      (only when not the default)

A space that samples several head groups per layer also records their number, ``L{i}.n_groups``
(derived from the groups; ``decode`` checks it).
Layers that share one configuration (a search-space rule with ``shared: true``) are named once,
by their range: ``L0-3.attention`` (layers 0 to 3) or ``L0,2.attention`` (layers 0 and 2).
Names never contain ``/`` (Ray would nest them). Keys that are not layer fields (``train.lr``)
are ignored by ``decode``; the search space, the study records and the queries all go through
``encode`` / ``decode`` / ``layer_key`` / ``group_key``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from arch.checks import field_names
from arch.config import ArchConfig
from arch.errors import ConfigError
from arch.layers import HeadGroup, LayerSpec

# Layer fields always written (the search samples them); the others only when not default.
ALWAYS = ("attention", "mlp_ratio")
LAYER_FIELDS = tuple(name for name in field_names(LayerSpec) if name != "heads")
GROUP_FIELDS = field_names(HeadGroup)
DEFAULTS = {f.name: f.default for f in fields(LayerSpec) if f.default is not MISSING}
GROUP_COUNT = "n_groups"  # derived: len(layer.heads)
_KEY = re.compile(r"^L(\d+(?:-\d+|(?:,\d+)+)?)\.(?:g(\d+)\.)?(\w+)$")


def layers_name(layers: Sequence[int]) -> str:
    """``3``, ``0-3`` (a contiguous range) or ``0,2,5``."""
    layers = sorted(layers)
    if len(layers) == 1:
        return str(layers[0])
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers))


def layer_key(layers: Sequence[int], name: str) -> str:
    """The param name of layer field ``name`` for ``layers`` (one layer, or a shared set)."""
    return f"L{layers_name(layers)}.{name}"


def group_key(layers: Sequence[int], group: int, name: str) -> str:
    """The param name of head-group field ``name`` of group ``group``."""
    return f"L{layers_name(layers)}.g{group}.{name}"


def parse_key(key: str) -> tuple[tuple[int, ...], int | None, str] | None:
    """``(layers, group or None, field)`` of a layer param name; None for other keys."""
    match = _KEY.match(key)
    if match is None:
        return None
    spec, group, name = match.groups()
    if "-" in spec:
        first, last = map(int, spec.split("-"))
        layers = tuple(range(first, last + 1))
    else:
        layers = tuple(int(v) for v in spec.split(","))
    return layers, None if group is None else int(group), name


def encode_layer(layer: LayerSpec, layers: Sequence[int] = (0,),
                 group_count: bool = False) -> dict[str, Any]:
    """The params of one layer configuration, named for ``layers`` (with ``n_groups`` if
    ``group_count``)."""
    params: dict[str, Any] = {}
    if group_count:
        params[layer_key(layers, GROUP_COUNT)] = layer.n_groups
    for name in LAYER_FIELDS:
        value = getattr(layer, name)
        if name in ALWAYS or value != DEFAULTS[name]:
            params[layer_key(layers, name)] = value
    for j, group in enumerate(layer.heads):
        for name, value in group.to_dict().items():  # kv_heads only when grouped
            params[group_key(layers, j, name)] = value
    return params


def encode(arch: ArchConfig, shared: Iterable[Sequence[int]] = ()) -> dict[str, Any]:
    """The flat params of ``arch``'s layers; each set in ``shared`` (layers with one identical
    configuration) is named once by its range.

    Raises:
        ConfigError: a shared set whose layers differ.
    """
    params: dict[str, Any] = {}
    done: set[int] = set()
    for group in shared:
        first = arch.layers[min(group)]
        differ = [i for i in group if arch.layers[i] != first]
        if differ:
            raise ConfigError([f"layers {differ}: differ from layer {min(group)}, so they "
                               f"cannot share its configuration"])
        params.update(encode_layer(first, group))
        done.update(group)
    for i, layer in enumerate(arch.layers):
        if i not in done:
            params.update(encode_layer(layer, (i,)))
    return params


def decode(params: Mapping[str, Any], template: ArchConfig) -> ArchConfig:
    """Rebuild the architecture from flat params; global fields come from ``template``.

    Raises:
        ConfigError: a layer or head group left without its fields, or invalid values.
    """
    layer_fields: dict[int, dict[str, Any]] = {}
    group_fields: dict[tuple[int, int], dict[str, Any]] = {}
    counts: dict[int, Any] = {}
    for key, value in params.items():
        parsed = parse_key(key)
        if parsed is None:
            continue  # training hyper-parameters live beside the architecture
        indices, group, name = parsed
        for i in indices:
            if name == GROUP_COUNT:
                counts[i] = value
            elif group is None:
                layer_fields.setdefault(i, {})[name] = value
            else:
                group_fields.setdefault((i, group), {})[name] = value
    depth = 1 + max(layer_fields, default=-1)
    missing = [i for i in range(depth) if i not in layer_fields]
    if missing or not depth:
        raise ConfigError([f"params: no fields for layers {missing or [0]}"])
    layers: list[LayerSpec] = []
    for i in range(depth):
        groups = sorted(j for k, j in group_fields if k == i)
        if groups != list(range(counts.get(i, len(groups)))):
            raise ConfigError([f"params: layer {i} has head groups {groups}, expected "
                               f"0..{counts.get(i, len(groups)) - 1}"])
        data = {**layer_fields[i], "heads": [group_fields[(i, j)] for j in groups]}
        layers.append(LayerSpec.from_dict(data, f"L{i}"))
    return ArchConfig.from_dict({**template.to_dict(),
                                 "layers": [layer.to_dict() for layer in layers]})
