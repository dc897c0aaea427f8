"""The checkpoint format: what a checkpoint holds and how a run is restored from it, its atomic writes and
safe reads (a file or a sharded folder), and where a preempted run saves."""
