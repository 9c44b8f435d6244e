"""Checks that an unknown dtype is refused and every allowed one accepted by
``validate_model`` [DTYPE-1] (:mod:`kvspec.conformance.refusals`).
"""

from __future__ import annotations

import copy
from typing import cast

from hypothesis import strategies as st

from kvspec.conformance.checks import Context, Example, OutsideDomain, check
from kvspec.conformance.checks.expectations import expect
from kvspec.conformance.families.transfer.errors import ERROR_CASES
from kvspec.conformance.refusals import config_between, pinned, refusal_check, valid_configs
from kvspec.conformance.tiers import BREAKS
from kvspec.conformance.transfer_config import TransferConfig, handed
from kvspec.topology.model import ModelShape

_UNKNOWN_DTYPES = ("int8", "float64", "uint8", "float8_e4m3fnuz", "bool", "bf16", "half", "fp8")


refusal_check(
    "DTYPE-1",
    "refuses-unknown-dtype",
    "only the allowed dtypes",
    ("DTYPE-1.1",),
    valid_configs,
    method="validate_model",
    variants=lambda adapter, config: [
        (
            "DTYPE-1.1",
            f"dtype {d!r}",
            {**config, "model": {**config["model"], "dtype": d, "scale_format": None}},
        )
        for d in _UNKNOWN_DTYPES
    ],
    pins=pinned(ERROR_CASES, "DTYPE-1"),
)


@check(
    "DTYPE-1",
    "accepts-allowed",
    "every allowed dtype of the domain is accepted, for MHA and MLA",
    needs=("models",),
    strategy=lambda adapter: st.tuples(
        st.sampled_from(adapter.domain.model_dtypes()),
        st.sampled_from(adapter.domain.attention),
    ).map(
        lambda pair: config_between(
            1,
            1,
            ModelShape.mla(2, 8, dtype=pair[0]).to_dict()
            if pair[1] == "mla"
            else ModelShape(4, 4, 8, dtype=pair[0]).to_dict(),
        )
    ),
    covers=("DTYPE-1.2",),
)
def accepts_allowed(ctx: Context, config: Example) -> None:
    if config["model"]["dtype"] not in ctx.adapter.domain.model_dtypes():
        raise OutsideDomain
    handed(config)  # its keys are a TransferConfig's
    try:
        ctx.adapter.validate_model(copy.deepcopy(cast(TransferConfig, config)))
    except Exception as error:
        expect(
            False,
            f"a {config['model']['dtype']} model ({config['model']}) was refused: {error!r}; "
            "each allowed dtype is accepted [DTYPE-1.2]",
            tier=BREAKS,
        )
