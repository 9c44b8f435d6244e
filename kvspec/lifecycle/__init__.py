"""Lifecycle: when memory may be touched — transfer handles, the block pool, aborts,
deadlines and peer epochs [LIFE-1..7]; a reference state machine and a trace checker."""
