"""The payloads family's error cases: invalid inputs the reference refuses, each with the
clause that refuses it and the message it must match [PAYLOAD].
"""

from __future__ import annotations

from kvspec.error_cases import ErrorCase
from kvspec.error_cases.inputs import MERGE, PAYLOAD

ERROR_CASES: tuple[ErrorCase, ...] = (
    ErrorCase(
        "payload-unknown-key",
        "PAYLOAD-1",
        "payload",
        {**PAYLOAD, "priority": 1},
        r"payload has missing keys \[\] and unknown keys \['priority'\]",
    ),
    ErrorCase(
        "payload-layer-count",
        "PAYLOAD-1",
        "payload",
        {**PAYLOAD, "metadata": {**PAYLOAD["metadata"], "num_layers": 3}},
        r"layer_blocks.key_cache must be a list of num_layers=3 entries, got 2",
    ),
    ErrorCase(
        "payload-seq-len",
        "PAYLOAD-1",
        "payload",
        {**PAYLOAD, "metadata": {**PAYLOAD["metadata"], "seq_len": 5}},
        r"key_cache\[1\] has shape \[3, 2, 4\]; expected \[seq_len=5",
    ),
    ErrorCase(
        "payload-dtype",
        "PAYLOAD-1",
        "payload",
        {**PAYLOAD, "metadata": {**PAYLOAD["metadata"], "dtype": "float16"}},
        r"key_cache\[1\] has dtype torch.bfloat16, metadata says float16",
    ),
    ErrorCase(
        "payload-no-layer",
        "PAYLOAD-1",
        "payload",
        {**PAYLOAD, "layer_blocks": {"key_cache": [None, None], "value_cache": [None, None]}},
        r"payload of request 'req_1' carries no layer",
    ),
    ErrorCase(
        "merge-request-ids-differ",
        "PAYLOAD-3",
        "merge",
        {**MERGE, "change": {"1": {"request_id": "req_2"}}},
        r"disagree on request_id \(source rank 0: 'req_1', source rank 1: 'req_2'\)",
    ),
    ErrorCase(
        "merge-seq-lens-differ",
        "PAYLOAD-3",
        "merge",
        {**MERGE, "change": {"0": {"seq_len": 1}}},
        r"disagree on seq_len \(source rank 0: 1, source rank 1: 2\)",
    ),
    ErrorCase(
        "merge-chunks-differ",
        "PAYLOAD-3",
        "merge",
        {**MERGE, "change": {"1": {"chunk": {"chunk_id": 1, "token_start": 2, "final": True}}}},
        r"disagree on chunk",
    ),
    ErrorCase(
        "merge-layer-missing-on-one-shard",
        "PAYLOAD-3",
        "merge",
        {**MERGE, "change": {"1": {"drop_layer": 0}}},
        r"layer 0 is present on the shard of source rank 0 and missing on the shard of "
        r"source rank 1",
    ),
)
