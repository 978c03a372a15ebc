"""Write: creation, the read-first rule, staleness, and the read state it leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import pytest

from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.read import ReadTool
from agentfsm.tools.write import WriteTool

NOT_READ = "File has not been read yet. Read it first before writing to it."
MODIFIED = ("File has been modified since read, either by the user or by a linter. "
            "Read it again before attempting to write it.")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


async def write(ctx: ToolContext, path: Path | str, content: str) -> str:
    return (await WriteTool().call({"file_path": str(path), "content": content}, ctx)).data


def bump_mtime(path: Path, seconds: float = 5) -> None:
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + seconds))


async def test_creates_a_new_file_and_its_parents(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "new.txt"
    assert await write(ctx, target, "hello\n") == f"File created successfully at: {target}"
    assert target.read_text() == "hello\n"
    assert ctx.read_files[str(target)] == target.stat().st_mtime


async def test_existing_file_must_be_read_first(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(ToolError) as err:
        await write(ctx, target, "new")
    assert str(err.value) == NOT_READ
    assert target.read_text() == "old"
    verdict = await WriteTool().validate_input({"file_path": str(target), "content": "x"}, ctx)
    assert not verdict.ok and verdict.message == NOT_READ


async def test_update_after_read(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    await ReadTool().call({"file_path": str(target)}, ctx)
    assert (await WriteTool().validate_input({"file_path": str(target), "content": "x"}, ctx)).ok
    assert await write(ctx, target, "new") == f"The file {target} has been updated successfully."
    assert target.read_text() == "new"
    # the write counts as the latest read: writing again needs no new Read
    bump_mtime(target, 0)
    assert await write(ctx, target, "newer") == f"The file {target} has been updated successfully."


async def test_modified_since_read_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    await ReadTool().call({"file_path": str(target)}, ctx)
    target.write_text("changed by someone else")
    bump_mtime(target)
    with pytest.raises(ToolError) as err:
        await write(ctx, target, "new")
    assert str(err.value) == MODIFIED
    assert target.read_text() == "changed by someone else"
    verdict = await WriteTool().validate_input({"file_path": str(target), "content": "x"}, ctx)
    assert verdict.message == MODIFIED


async def test_content_is_written_byte_for_byte(ctx: ToolContext, tmp_path: Path) -> None:
    target = tmp_path / "crlf.txt"
    await write(ctx, target, "a\r\nb\r\n\u00e9")
    assert target.read_bytes() == "a\r\nb\r\n\u00e9".encode()


async def test_relative_path_and_directory(ctx: ToolContext, tmp_path: Path) -> None:
    assert await write(ctx, "rel/x.txt", "r") == "File created successfully at: rel/x.txt"
    assert (tmp_path / "rel" / "x.txt").read_text() == "r"
    with pytest.raises(ToolError, match="is a directory"):
        await write(ctx, tmp_path / "rel", "x")


async def test_read_through_a_symlink_counts_for_the_target(ctx: ToolContext, tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("x")
    (tmp_path / "link.txt").symlink_to(real)
    await ReadTool().call({"file_path": str(tmp_path / "link.txt")}, ctx)
    assert await write(ctx, real, "y") == f"The file {real} has been updated successfully."


def test_tool_traits_and_schema() -> None:
    t = WriteTool()
    assert t.name == "Write"
    assert not t.is_concurrency_safe({"file_path": "/x", "content": ""})
    assert not t.is_read_only({})
    assert t.interrupt_behavior() == "block"
    jsonschema.Draft202012Validator.check_schema(t.input_schema)
    assert t.input_schema["required"] == ["file_path", "content"]
    assert t.input_schema["additionalProperties"] is False
    assert set(t.input_schema["properties"]) == {"file_path", "content"}
