"""Tensors: dtypes and bit-exact comparison, a request's KV, head slicing, resharding
and the coordinate-hash oracle [DTYPE, SLICE, RESHARD, ORACLE]."""
