"""bench/mutation.py's incremental campaign (--since): which lines a diff touches, which mutants change them.
Needs the ``mutation`` extra (cosmic-ray); skips without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray", reason="the mutation extra is not installed (pip install -e '.[mutation]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import mutation
from cosmic_ray.work_item import MutationSpec, WorkItem

DIFF = """diff --git a/fsm/x.py b/fsm/x.py
--- a/fsm/x.py
+++ b/fsm/x.py
@@ -10 +10 @@ def f():
-    return 1
+    return 2
@@ -20,0 +21,3 @@ def g():
+    a = 1
+    b = 2
+    c = 3
@@ -40,2 +43,0 @@ def h():
-    gone = 1
-    gone = 2
@@ -50,2 +51 @@ def k():
"""


def test_changed_lines_are_the_new_sides_lines_and_both_sides_of_a_deletion() -> None:
    assert mutation.changed_lines(DIFF) == {10, 21, 22, 23, 43, 44, 51}
    assert mutation.changed_lines("") == set()


def _item(job: str, start: int, end: int) -> WorkItem:
    spec = MutationSpec(Path("fsm/x.py"), "core/NumberReplacer", 0, (start, 4), (end, 9))
    return WorkItem.single(job, spec)


def test_only_mutants_that_change_a_touched_line_are_kept() -> None:
    items = [_item("a", 9, 9), _item("b", 10, 10), _item("c", 8, 11), _item("d", 30, 30), _item("e", 44, 44)]
    assert [i.job_id for i in mutation.on_lines(items, {10, 44})] == ["b", "c", "e"]
    assert mutation.on_lines(items, set()) == []
