"""Mutants of refusing unknown dtypes [DTYPE-1].

Each validates like the reference but normalises one dtype name or knows one fp8 format
too few, the way a config loader written for the model in front of it does.
"""

from __future__ import annotations

import copy

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.transfer_config import TransferConfig, models
from kvspec.tensors.dtypes import DTYPES

Config = TransferConfig


@mutant("DTYPE-1.1")
class Fp8VariantsAccepted(ReferenceAdapter):
    """Accepts any name starting with 'float8' (float8_e4m3fnuz included) as e4m3fn."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            if str(model["dtype"]).startswith("float8") and model["dtype"] not in DTYPES:
                model["dtype"] = "float8_e4m3fn"
                model["scale_format"] = "per_layer"
        super().validate_model(given)


_ALIASES = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "fp8": "float8_e4m3fn"}


@mutant("DTYPE-1.1")
class DtypeAliasesAccepted(ReferenceAdapter):
    """Accepts framework aliases of dtype names ('bf16', 'half', 'fp8')."""

    def validate_model(self, config: Config) -> None:
        given = copy.deepcopy(config)
        for model in models(given):
            if model["dtype"] in _ALIASES:
                model["dtype"] = _ALIASES[model["dtype"]]
                model["scale_format"] = None
        super().validate_model(given)


@mutant("DTYPE-1.2")
class OnlyE4m3Fp8(ReferenceAdapter):
    """Knows one fp8 format: refuses float8_e5m2 caches."""

    def validate_model(self, config: Config) -> None:
        if any(m.get("dtype") == "float8_e5m2" for m in models(config)):
            raise ValueError("unsupported dtype float8_e5m2")
        super().validate_model(config)
