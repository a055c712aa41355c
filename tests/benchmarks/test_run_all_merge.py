"""``run_all.py --only``: a benchmark's fresh table replaces its own section's generated part
in an existing RESULTS.md, and nothing else."""

from __future__ import annotations

from benchmarks.run_all import merge_sections

OLD = """# aenv benchmark results

Machine: old.

## Alpha

| a |
| - |
| 1 |

_(5 s, command: `python benchmarks/bench_alpha.py`)_

_A note written after the run, with a later table:_

| a |
| - |
| 2 |

_(7 s, command: `python benchmarks/bench_alpha.py`)_

## Beta

| b |
| - |
| 1 |

_(3 s, command: `python benchmarks/bench_beta.py`)_

<!-- reliability:start -->
kept
<!-- reliability:end -->
"""


def test_only_the_generated_part_of_the_section_is_replaced():
    new = (
        "## Alpha\n\n| a |\n| - |\n| 9 |\n\n_(6 s, command: `python benchmarks/bench_alpha.py`)_\n"
    )
    out = merge_sections(OLD, [new])
    assert "| 9 |" in out and "| 1 |\n\n_(5 s" not in out
    # the note and the later table under the section stay, in order, after the new table
    assert out.index("| 9 |") < out.index("A note written after the run") < out.index("| 2 |")
    assert "_(7 s, command: `python benchmarks/bench_alpha.py`)_" in out
    # every other section, the header and the kept markers are untouched
    assert out.startswith("# aenv benchmark results\n\nMachine: old.\n")
    assert out[out.index("## Beta") :] == OLD[OLD.index("## Beta") :]
    assert out.count("## Alpha") == 1


def test_a_failed_run_replaces_the_table_and_a_new_section_is_appended():
    failed = "## Beta\n\nFAILED:\n\n```\nboom\n```\n"
    fresh = (
        "## Gamma\n\n| g |\n| - |\n| 1 |\n\n_(1 s, command: `python benchmarks/bench_gamma.py`)_\n"
    )
    out = merge_sections(OLD, [failed, fresh])
    beta = out[out.index("## Beta") : out.index("<!-- reliability:start -->")]
    assert "FAILED" in beta and "| b |" not in beta
    assert out.rstrip().endswith(fresh.rstrip())
    assert out[: out.index("## Beta")] == OLD[: OLD.index("## Beta")]


def test_notes_after_a_table_without_a_command_line_are_kept():
    old = (
        "## Alpha\n\n### sub\n\n| a |\n| - |\n| 1 |\n\n_(a note, no command line)_\n\n"
        "_A later note:_\n\n| a |\n| - |\n| 2 |\n\n## Beta\n\nkept\n"
    )
    new = (
        "## Alpha\n\n### sub\n\n| a |\n| - |\n| 9 |\n\n_(6 s, command: `python benchmarks/x.py`)_\n"
    )
    out = merge_sections(old, [new])
    assert "| 1 |" not in out
    assert out.index("| 9 |") < out.index("_(a note, no command line)_") < out.index("| 2 |")
    assert out.endswith("## Beta\n\nkept\n")
