"""Edit: Claude Code's error texts, replace/replace_all semantics, creation, line endings."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.edit import EditTool, apply_edit
from agentfsm.tools.read import ReadTool

NOT_READ = "File has not been read yet. Read it first before writing to it."
MODIFIED = ("File has been modified since read, either by the user or by a linter. "
            "Read it again before attempting to write it.")
SAME = "No changes to make: old_string and new_string are exactly the same."


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


async def read_first(ctx: ToolContext, path: Path) -> None:
    await ReadTool().call({"file_path": str(path)}, ctx)


async def edit(ctx: ToolContext, path: Path, old: str, new: str, **kw: Any) -> str:
    return (await EditTool().call({"file_path": str(path), "old_string": old, "new_string": new, **kw},
                                  ctx)).data


async def edit_error(ctx: ToolContext, path: Path, old: str, new: str, **kw: Any) -> str:
    inp = {"file_path": str(path), "old_string": old, "new_string": new, **kw}
    verdict = await EditTool().validate_input(inp, ctx)
    with pytest.raises(ToolError) as err:
        await EditTool().call(inp, ctx)
    assert not verdict.ok and verdict.message == str(err.value)
    return str(err.value)


@pytest.fixture
async def src(ctx: ToolContext, tmp_path: Path) -> Path:
    path = tmp_path / "src.py"
    path.write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
    await read_first(ctx, path)
    return path


async def test_unique_replacement_says_the_file_state_is_current(ctx: ToolContext, src: Path) -> None:
    out = await edit(ctx, src, "def g():", "def h():")
    assert src.read_text() == "def f():\n    return 1\n\ndef h():\n    return 1\n"
    # Claude Code's text: no snippet of the edited lines, a note that the model's view is current
    assert out == (f"The file {src} has been updated successfully. (file state is current in your context "
                   "\u2014 no need to Read it back)")


async def test_replace_all(ctx: ToolContext, src: Path) -> None:
    out = await edit(ctx, src, "return 1", "return 2", replace_all=True)
    assert src.read_text().count("return 2") == 2
    assert out.startswith(f"The file {src} has been updated. All occurrences were successfully replaced.")


async def test_not_read_yet(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("abc")
    assert await edit_error(ctx, path, "a", "b") == NOT_READ
    assert path.read_text() == "abc"


async def test_modified_since_read_still_applies_with_a_note(ctx: ToolContext, src: Path) -> None:
    # Claude Code 2.1.332: a changed file is edited when old_string still applies, and the model is told
    src.write_text(src.read_text() + "# linter\n")
    st_ = src.stat()
    os.utime(src, (st_.st_atime, st_.st_mtime + 5))
    assert await edit(ctx, src, "def g", "def h") == (
        f"The file {src} has been updated successfully. (note: the file had been modified on disk since you last "
        "read it \u2014 the edit applied cleanly, but the file contains other changes not in your context. Read it "
        "before edits that depend on surrounding content.)")
    assert "def h" in src.read_text() and src.read_text().endswith("# linter\n")
    # it no longer applies: refused, and the model is told to read the file again
    src.write_text("other\n")
    os.utime(src, (st_.st_atime, st_.st_mtime + 10))
    assert await edit_error(ctx, src, "def f", "def k") == MODIFIED


async def test_string_not_found(ctx: ToolContext, src: Path) -> None:
    message = await edit_error(ctx, src, "def zzz", "x")
    assert message == "String to replace not found in file.\nString: def zzz"


async def test_multiple_matches_without_replace_all(ctx: ToolContext, src: Path) -> None:
    assert await edit_error(ctx, src, "return 1", "return 2") == (
        "Found 2 matches of the string to replace, but replace_all is false. To replace all occurrences, "
        "set replace_all to true. To replace only one occurrence, please provide more context to uniquely "
        "identify the instance.\nString: return 1")


async def test_same_strings(ctx: ToolContext, src: Path) -> None:
    assert await edit_error(ctx, src, "def f", "def f") == SAME


async def test_same_strings_is_checked_before_reading(ctx: ToolContext, tmp_path: Path) -> None:
    # validate_input needs neither the file nor a prior Read for this one
    assert await edit_error(ctx, tmp_path / "missing.txt", "a", "a") == SAME


async def test_missing_file(ctx: ToolContext, tmp_path: Path) -> None:
    msg = await edit_error(ctx, tmp_path / "missing.txt", "a", "b")
    assert msg == f"File does not exist. Note: your current working directory is {tmp_path}."


async def test_empty_old_string_creates_a_file(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "new" / "file.txt"
    assert (await EditTool().validate_input(
        {"file_path": str(path), "old_string": "", "new_string": "hi\n"}, ctx)).ok
    out = await edit(ctx, path, "", "hi\n")
    assert path.read_text() == "hi\n"
    assert out.startswith(f"The file {path} has been updated successfully.")
    # the file is now in the read state: a follow-up edit needs no Read
    await edit(ctx, path, "hi", "ho")
    assert path.read_text() == "ho\n"


async def test_empty_old_string_on_existing_file(ctx: ToolContext, src: Path, tmp_path: Path) -> None:
    assert await edit_error(ctx, src, "", "x") == "Cannot create new file - file already exists."
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n")
    await edit(ctx, blank, "", "filled\n")
    assert blank.read_text() == "filled\n"


async def test_validation_writes_nothing(ctx: ToolContext, src: Path) -> None:
    before = src.read_text()
    verdict = await EditTool().validate_input(
        {"file_path": str(src), "old_string": "def f", "new_string": "def q"}, ctx)
    assert verdict.ok
    assert src.read_text() == before


async def test_crlf_file_stays_crlf(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "w.txt"
    path.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    await read_first(ctx, path)
    await edit(ctx, path, "two\nthree", "2\n3")
    assert path.read_bytes() == b"one\r\n2\r\n3\r\n"


async def test_bom_is_kept(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "b.txt"
    path.write_bytes(b"\xef\xbb\xbfhello\n")
    await read_first(ctx, path)
    await edit(ctx, path, "hello", "bye")
    assert path.read_bytes() == b"\xef\xbb\xbfbye\n"


async def test_straight_quotes_match_typographic_ones(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "q.md"
    path.write_text("He said \u201chello\u201d.\n")
    await read_first(ctx, path)
    await edit(ctx, path, 'said "hello"', 'said "bye"')
    assert path.read_text() == "He said \u201cbye\u201d.\n"


async def test_deleting_a_line_takes_its_newline(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("keep\ndrop me\nkeep too\n")
    await read_first(ctx, path)
    await edit(ctx, path, "drop me", "")
    assert path.read_text() == "keep\nkeep too\n"


def test_tool_traits_and_schema() -> None:
    t = EditTool()
    assert t.name == "Edit"
    assert not t.is_concurrency_safe({}) and not t.is_read_only({})
    assert t.interrupt_behavior() == "block"
    jsonschema.Draft202012Validator.check_schema(t.input_schema)
    assert t.input_schema["required"] == ["file_path", "old_string", "new_string"]
    assert t.input_schema["additionalProperties"] is False
    assert t.input_schema["properties"]["replace_all"]["default"] is False


# --- properties: replace / replace_all agree with str.replace ------------------------------

texts = st.text(alphabet="ab \n", max_size=30)
needles = st.text(alphabet="ab \n", min_size=1, max_size=4)
replacements = st.text(alphabet="abc \n", min_size=1, max_size=4)


@given(text=texts, old=needles, new=replacements, replace_all=st.booleans())
def test_apply_edit_agrees_with_str_replace(text: str, old: str, new: str, replace_all: bool) -> None:
    assume(old != new)
    count = text.count(old)
    if count == 0:
        with pytest.raises(ToolError, match="String to replace not found"):
            apply_edit(text, old, new, replace_all)
    elif count > 1 and not replace_all:
        with pytest.raises(ToolError, match=f"^Found {count} matches of the string to replace"):
            apply_edit(text, old, new, replace_all)
    else:
        result, anchor = apply_edit(text, old, new, replace_all)
        assert result == text.replace(old, new, -1 if replace_all else 1)
        assert anchor == text.find(old)


@given(parts=st.lists(st.text(alphabet="ab \n", max_size=6), min_size=2, max_size=5),
       old=needles.filter(lambda s: not s.endswith("\n")), replace_all=st.booleans())
def test_deleting_takes_the_following_newline(parts: list[str], old: str, replace_all: bool) -> None:
    text = old.join(parts)
    replace_all = replace_all or text.count(old) > 1
    result, _ = apply_edit(text, old, "", replace_all)
    line = old + "\n"
    if line not in text:
        assert result == text.replace(old, "", -1 if replace_all else 1)
    elif replace_all:
        assert result == text.replace(line, "").replace(old, "")
    else:
        assert result == text.replace(line, "", 1)


@settings(max_examples=30, deadline=None)
@given(parts=st.lists(st.text(alphabet="ab \n", max_size=6), min_size=2, max_size=4), old=needles,
       new=replacements, replace_all=st.booleans())
def test_edit_tool_on_disk_agrees_with_str_replace(parts: list[str], old: str, new: str,
                                                   replace_all: bool) -> None:
    assume(old != new)
    text = old.join(parts)
    replace_all = replace_all or text.count(old) > 1
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "f.txt")
        path.write_text(text, encoding="utf-8", newline="")
        ctx = ToolContext(cwd=Path(d), file_access=NoFileRules())

        async def run() -> None:
            await ReadTool().call({"file_path": str(path)}, ctx)
            await EditTool().call({"file_path": str(path), "old_string": old, "new_string": new,
                                   "replace_all": replace_all}, ctx)

        asyncio.run(run())
        assert path.read_bytes().decode() == text.replace(old, new, -1 if replace_all else 1)


async def test_edit_and_write_refuse_special_files_without_blocking(ctx: ToolContext, tmp_path: Path) -> None:
    import asyncio
    import os

    from agentfsm.tools.read import record_read

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    record_read(ctx, fifo)
    edit = await asyncio.wait_for(EditTool().validate_input(
        {"file_path": str(fifo), "old_string": "a", "new_string": "b"}, ctx), 5)
    assert not edit.ok and "not a regular file" in edit.message
    from agentfsm.tools.write import WriteTool

    write = await asyncio.wait_for(WriteTool().validate_input({"file_path": str(fifo), "content": "x"}, ctx), 5)
    assert not write.ok and "not a regular file" in write.message


async def test_a_file_of_exactly_the_size_cap_is_edited_and_one_byte_more_is_refused(
        ctx: ToolContext, tmp_path: Path) -> None:
    from agentfsm.tools.edit import MAX_EDIT_BYTES
    from agentfsm.tools.read import record_read

    at_cap, over = tmp_path / "at_cap.txt", tmp_path / "over.txt"
    for path, size in ((at_cap, MAX_EDIT_BYTES), (over, MAX_EDIT_BYTES + 1)):
        with path.open("wb") as fh:
            fh.write(b"HELLO\n")
            fh.truncate(size)  # the rest reads as NUL bytes (sparse: no 64 MB written)
        record_read(ctx, path)
    assert "File is too large to edit" in await edit_error(ctx, over, "HELLO", "HI")
    await edit(ctx, at_cap, "HELLO", "HI")
    with at_cap.open("rb") as fh:
        assert fh.read(3) == b"HI\n"
    assert at_cap.stat().st_size == MAX_EDIT_BYTES - 3


# --- what the model and an SDK user receive (the survivors of the full campaign run, issue 35) -----

CURRENT = " (file state is current in your context \u2014 no need to Read it back)"


async def call(ctx: ToolContext, path: Path, old: str, new: str, **kw: Any) -> Any:
    return await EditTool().call({"file_path": str(path), "old_string": old, "new_string": new, **kw}, ctx)


async def test_the_structured_result_of_an_edit(ctx: ToolContext, src: Path) -> None:
    from agentfsm.tools.patch import structured_patch

    before = src.read_text()
    out = await call(ctx, src, "def g():", "def h():")
    assert out.structured == {
        "filePath": str(src), "oldString": "def g():", "newString": "def h():", "originalFile": before,
        "structuredPatch": structured_patch(before, src.read_text()), "userModified": False,
        "replaceAll": False, "contentNotInModelContext": True}
    assert out.structured["structuredPatch"] != []
    out = await call(ctx, src, "return 1", "return 2", replace_all=True)
    assert out.structured["replaceAll"] is True and out.structured["originalFile"] == before.replace("g()", "h()")


async def test_the_structured_patch_of_a_crlf_file_is_of_the_bytes_written(ctx: ToolContext, tmp_path: Path) -> None:
    from agentfsm.tools.patch import structured_patch

    path = tmp_path / "w.txt"
    path.write_bytes(b"one\r\ntwo\r\n")
    await read_first(ctx, path)
    out = await call(ctx, path, "two", "2")
    assert out.structured["originalFile"] == "one\r\ntwo\r\n"
    assert out.structured["structuredPatch"] == structured_patch("one\r\ntwo\r\n", "one\r\n2\r\n")


async def test_the_user_modified_text_and_result(ctx: ToolContext, src: Path) -> None:
    ctx.user_modified = True
    out = await call(ctx, src, "def g():", "def h():")
    assert out.data == (f"The file {src} has been updated successfully.  The user modified your proposed "
                        "changes before accepting them. .")
    assert out.structured["userModified"] is True and out.structured["newString"] == "def h():"


async def test_creating_a_file_in_new_directories_writes_lf_and_says_the_state_is_current(
        ctx: ToolContext, tmp_path: Path) -> None:
    from agentfsm.tools.patch import structured_patch

    for path in (tmp_path / "made.txt", tmp_path / "a" / "b" / "made.txt"):
        out = await call(ctx, path, "", "x\ny\n")
        assert path.read_bytes() == b"x\ny\n"
        assert out.data == f"The file {path} has been updated successfully.{CURRENT}"
        assert out.structured["originalFile"] is None
        assert out.structured["structuredPatch"] == structured_patch("", "x\ny\n") != []


async def test_filling_an_empty_file(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(b" \n")
    out = await call(ctx, path, "", "x\ny\n")
    assert path.read_bytes() == b"x\ny\n"
    assert out.data == f"The file {path} has been updated successfully.{CURRENT}"
    assert out.structured["originalFile"] == " \n"


async def test_a_failed_write_in_the_systems_words(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file, not a directory")
    target = tmp_path / "plain" / "sub" / "new.txt"
    verdict = await EditTool().validate_input({"file_path": str(target), "old_string": "", "new_string": "x"}, ctx)
    assert verdict.ok  # the trouble shows only when writing
    with pytest.raises(ToolError) as err:
        await call(ctx, target, "", "x")
    assert str(err.value) in (f"Could not write {target}: File exists", f"Could not write {target}: Not a directory")


async def test_a_directory_is_refused_in_words(ctx: ToolContext, tmp_path: Path) -> None:
    assert await edit_error(ctx, tmp_path, "a", "b") == f"{tmp_path} is a directory; Edit needs a file path."


async def test_a_file_that_is_not_utf8_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9 au lait\n")
    from agentfsm.tools.read import record_read

    record_read(ctx, path)
    assert await edit_error(ctx, path, "au", "with") == (
        f"File {path} is not valid UTF-8, so Edit will not change it: use a shell command that keeps its encoding.")
    assert path.read_bytes() == b"caf\xe9 au lait\n"


async def test_the_size_cap_is_64_mb_and_said_so(ctx: ToolContext, tmp_path: Path) -> None:
    from agentfsm.tools.read import record_read

    # (a file at the cap is edited: test_a_file_of_exactly_the_size_cap_is_edited_and_one_byte_more_is_refused)
    sizes = {"over": 64 * 1024 * 1024 + 1, "big": 100 * 1024 * 1024}
    for name, size in sizes.items():
        with (tmp_path / name).open("wb") as fh:
            fh.write(b"HELLO\n")
            fh.truncate(size)
        record_read(ctx, tmp_path / name)
    for name, shown in (("over", "64.0"), ("big", "100.0")):
        assert await edit_error(ctx, tmp_path / name, "HELLO", "HI") == (
            f"File is too large to edit ({shown} MB; Edit changes files up to 64 MB). Use a shell command such "
            "as sed instead.")


def test_replace_all_defaults_to_false_in_the_input_everyone_sees() -> None:
    from agentfsm.runtime.phases import complete_tool_input

    block = {"type": "tool_use", "name": "Edit", "input": {"file_path": "/f", "old_string": "a", "new_string": "b"}}
    complete_tool_input(block, {"Edit": EditTool()})
    assert block["input"] == {"replace_all": False, "file_path": "/f", "old_string": "a", "new_string": "b"}


def test_the_schema_the_model_is_shown() -> None:
    props = EditTool().input_schema["properties"]
    assert EditTool().input_schema["type"] == "object"
    assert {k: v["type"] for k, v in props.items()} == {
        "file_path": "string", "old_string": "string", "new_string": "string", "replace_all": "boolean"}
    assert all(isinstance(v["description"], str) and v["description"] for v in props.values())


# --- typographic quotes -------------------------------------------------------------------------


@pytest.mark.parametrize(("in_file", "typed", "new", "written"), [
    ("\u2018a\u2019", "'a'", "'b'", "\u2018b\u2019"),
    ("\u201ca\u201d", '"a"', '"b"', "\u201cb\u201d"),
    ("\u2018a", "'a", "'b", "\u2018b"),      # only an opening quote in the file
    ("a\u2019", "a'", "b'", "b\u2019"),      # only a closing one
    ("\u201ca", '"a', '"b', "\u201cb"),
    ("a\u201d", 'a"', 'b"', "b\u201d"),
    ("\u2018a\u2019", "'a'", "say 'hi' X\"", "say \u2018hi\u2019 X\""),
    ("\u2018a\u2019", "'a'", "'hello", "\u2018hello"),
    ("\u2018a\u2019", "'a'", "dogs'", "dogs\u2019"),
    ("\u2018a\u2019", "'a'", "it's", "it\u2019s"),
    ("\u2018a\u2019", "'a'", "don't (x 'y') a'", "don\u2019t (x \u2018y\u2019) a\u2019"),
    ("\u201ca\u201d", '"a"', 'X"y" (\u2014"z"', "X\u201dy\u201d (\u2014\u201cz\u201d"),
    ("\u201ca\u201d", '"a"', 'a"', "a\u201d"),
])
def test_straight_quotes_typed_take_the_files_typographic_style(in_file: str, typed: str, new: str,
                                                                written: str) -> None:
    text = f"x {in_file} y\n"
    assert apply_edit(text, typed, new, False)[0] == f"x {written} y\n"


def test_an_exact_match_is_preferred_to_a_typographic_one() -> None:
    text = '\u201ca\u201d and "a"\n'
    assert apply_edit(text, '"a"', '"b"', False)[0] == '\u201ca\u201d and "b"\n'


def test_a_typographic_old_string_keeps_the_new_strings_straight_quotes() -> None:
    assert apply_edit("x \u201ca\u201d\n", "\u201ca\u201d", '"b"', False)[0] == 'x "b"\n'


@given(body=st.text(alphabet="ab \n", max_size=8), new=st.text(alphabet="ab \n", max_size=6))
def test_quote_free_texts_are_replaced_as_typed(body: str, new: str) -> None:
    for curly, straight in (("\u2018", "'"), ("\u2019", "'"), ("\u201c", '"'), ("\u201d", '"')):
        text = f"{body}{curly}{body}"
        result, anchor = apply_edit(text, f"{straight}{body}", f"{new}!", False) if body.count(
            f"{curly}{body}") <= 1 and text.count(f"{curly}{body}") == 1 else (None, None)
        if result is not None:
            assert result == text.replace(f"{curly}{body}", f"{new}!", 1) and anchor == len(body)


async def test_a_file_that_grows_past_the_cap_after_its_size_is_taken_is_refused_not_cut_short(
        ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentfsm.tools.edit as edit_module
    from agentfsm.tools.read import record_read

    path = tmp_path / "growing.txt"
    with path.open("wb") as fh:
        fh.write(b"HELLO\n")
        fh.truncate(64 * 1024 * 1024 + 1)
    record_read(ctx, path)
    real_fstat = os.fstat

    def fstat_before_growth(fd: int) -> Any:  # what fstat saw before a writer appended the last byte
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 6, *st[7:10]))

    monkeypatch.setattr(edit_module.os, "fstat", fstat_before_growth)
    assert "File is too large to edit (64.0 MB" in await edit_error(ctx, path, "HELLO", "HI")
    assert path.stat().st_size == 64 * 1024 * 1024 + 1
