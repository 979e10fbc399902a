"""One module per capability: its tasks and the scenario step that shows it.

Each module defines ``run(app) -> list[str]``: it submits work to the running
workers, checks the outcome (raising ``AssertionError`` with a clear message if
it is wrong) and returns summary lines.
"""

DEMO_MODULES: tuple[str, ...] = (
    "example_project.demos.basics",
    "example_project.demos.stats",
    "example_project.demos.policies",
    "example_project.demos.concurrency",
    "example_project.demos.coalesce",
    "example_project.demos.herd",
    "example_project.demos.sync",
    "example_project.demos.consumer",
)
