"""Topology: stage layouts, model facts, who owns which heads and layers, and the
transfer plan between two stages [STAGE, MODEL, HEAD, LAYER, PLAN]."""
