"""The admission pipeline: the one path a task with a policy takes in the worker's main
process, through an ordered chain of gates, to the pool."""
