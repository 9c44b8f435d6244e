"""Mutants of validating model facts and their agreement [MODEL-1..3], and of moving an MLA
latent [MODEL-2].

Each validates like the reference but normalises or skips one fact, the way a config
loader written for the model in front of it does; the last assembles a latent as K and V.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.transfer_config import TransferConfig, models
from kvspec.tensors.dtypes import DTYPES
from kvspec.tensors.kv import RequestKV

Config = TransferConfig


def _without_fact(config: Config, fact: str) -> Config:
    """``config`` with the receiver's ``fact`` taken from the sender's model."""
    given = copy.deepcopy(config)
    if "target_model" in given and fact in given["model"]:
        given["target_model"][fact] = given["model"][fact]
    return given


@mutant("MODEL-1.1")
class SizesCoercedWithInt(ReferenceAdapter):
    """Reads model sizes with ``int()``: 8.0, "8" and True all pass as integers."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            for fact in ("num_layers", "num_kv_heads", "head_dim"):
                with contextlib.suppress(TypeError, ValueError):
                    model[fact] = int(model[fact])
        super().validate_model(given)


@mutant("MODEL-1.1")
class ZeroHeadDimAccepted(ReferenceAdapter):
    """Checks num_layers and num_kv_heads are positive but not head_dim."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            if isinstance(model["head_dim"], int) and model["head_dim"] < 1:
                model["head_dim"] = 1
        super().validate_model(given)


@mutant("MODEL-1.2")
class UnknownAttentionReadAsMha(ReferenceAdapter):
    """Treats every attention kind that is not 'mla' as MHA ('gqa', 'MHA', 'sparse' ...)."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            if model.get("attention", "mha") != "mla":
                model["attention"] = "mha"
        super().validate_model(given)


@mutant("MODEL-1.3")
class ScaleFormatIgnored(ReferenceAdapter):
    """Never reads the scale format: every fp8 model is taken as per-layer, others as none."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            model["scale_format"] = None
        super().validate_model(given)


@mutant("MODEL-2.2")
class MlaHeadCountIgnored(ReferenceAdapter):
    """For MLA, ignores num_kv_heads (the latent has no heads) instead of refusing H != 1."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            if model.get("attention") == "mla":
                model["num_kv_heads"] = 1
        super().validate_model(given)


@mutant("MODEL-3.1")
class LayerCountNotCompared(ReferenceAdapter):
    """Compares every model fact of the two stages but num_layers (PP checks it "later")."""

    def validate_agreement(self, config: Config) -> None:
        super().validate_agreement(_without_fact(config, "num_layers"))


@mutant("MODEL-3.2")
class HeadCountNotCompared(ReferenceAdapter):
    """Compares every model fact but num_kv_heads (each side derives its own heads per rank)."""

    def validate_agreement(self, config: Config) -> None:
        super().validate_agreement(_without_fact(config, "num_kv_heads"))


@mutant("MODEL-3.3")
class HeadDimNotCompared(ReferenceAdapter):
    """Compares every model fact but head_dim."""

    def validate_agreement(self, config: Config) -> None:
        super().validate_agreement(_without_fact(config, "head_dim"))


@mutant("MODEL-3.4")
class AttentionKindNotCompared(ReferenceAdapter):
    """Compares head counts and widths; an MLA latent and one MHA head of its width pass."""

    def validate_agreement(self, config: Config) -> None:
        super().validate_agreement(_without_fact(config, "attention"))


@mutant("MODEL-3.5")
class DtypeComparedByItemsize(ReferenceAdapter):
    """Compares the two stages' dtypes by element size: bfloat16 and float16 pass as equal."""

    def validate_agreement(self, config: Config) -> None:
        given = copy.deepcopy(config)
        if "target_model" in given:
            ours, theirs = given["model"], given["target_model"]
            if (
                ours["dtype"] in DTYPES
                and theirs["dtype"] in DTYPES
                and DTYPES[ours["dtype"]].itemsize == DTYPES[theirs["dtype"]].itemsize
            ):
                theirs["dtype"] = ours["dtype"]
                theirs["scale_format"] = ours.get("scale_format")
        super().validate_agreement(given)


@mutant("MODEL-2.1")
class MlaLatentDuplicatedAsV(ReferenceAdapter):
    """Assembles every cache as K and V: an MLA latent comes out twice, as K and as V."""

    def receiver_combine(self, case, dst, shipments):
        out = super().receiver_combine(case, dst, shipments)
        if out.data.shape[1] == 1:
            scales = None if out.scales is None else torch.cat([out.scales, out.scales], dim=1)
            return RequestKV(torch.cat([out.data, out.data], dim=1), scales)
        return out


@mutant("MODEL-3.2")
class HeadsTimesHeadDimCompared(ReferenceAdapter):
    """Compares the two stages' values per token and layer, num_kv_heads x head_dim, as a
    handshake that checks the block length it will read: each fact changed alone moves
    the product and is refused, but 8 heads of 64 pass for 4 heads of 128 (the clause:
    num_kv_heads and head_dim, each)."""

    def validate_agreement(self, config: Config) -> None:
        given = copy.deepcopy(config)
        if "target_model" in given:
            ours, theirs = given["model"], given["target_model"]
            with contextlib.suppress(TypeError, KeyError):
                if ours["num_kv_heads"] * ours["head_dim"] == (
                    theirs["num_kv_heads"] * theirs["head_dim"]
                ):
                    theirs["num_kv_heads"] = ours["num_kv_heads"]
                    theirs["head_dim"] = ours["head_dim"]
        super().validate_agreement(given)
