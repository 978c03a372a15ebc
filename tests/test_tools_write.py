"""Write: creation, the read-first rule, staleness, and the read state it leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import pytest

from agentfsm.tools.base import AccessDenial, NoFileRules, ToolContext, ToolError
from agentfsm.tools.read import FILE_STATE_CURRENT, ReadTool
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
    assert await write(ctx, target, "hello\n") == f"File created successfully at: {target}{FILE_STATE_CURRENT}"
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
    assert await write(ctx, target, "new") == f"The file {target} has been updated successfully.{FILE_STATE_CURRENT}"
    assert target.read_text() == "new"
    # the write counts as the latest read: writing again needs no new Read
    bump_mtime(target, 0)
    assert await write(ctx, target, "newer") == f"The file {target} has been updated successfully.{FILE_STATE_CURRENT}"


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
    assert await write(ctx, "rel/x.txt", "r") == f"File created successfully at: rel/x.txt{FILE_STATE_CURRENT}"
    assert (tmp_path / "rel" / "x.txt").read_text() == "r"
    with pytest.raises(ToolError, match="is a directory"):
        await write(ctx, tmp_path / "rel", "x")


async def test_read_through_a_symlink_counts_for_the_target(ctx: ToolContext, tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("x")
    (tmp_path / "link.txt").symlink_to(real)
    await ReadTool().call({"file_path": str(tmp_path / "link.txt")}, ctx)
    assert await write(ctx, real, "y") == f"The file {real} has been updated successfully.{FILE_STATE_CURRENT}"


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


# --- what an SDK user receives, and the texts of the rarer paths -----------------------------------


async def test_the_structured_result_of_a_create_and_of_an_update(ctx: ToolContext, tmp_path: Path) -> None:
    from agentfsm.tools.patch import structured_patch

    target = tmp_path / "a.txt"
    out = await WriteTool().call({"file_path": str(target), "content": "one\n"}, ctx)
    assert out.structured == {"type": "create", "filePath": str(target), "content": "one\n", "structuredPatch": [],
                              "originalFile": None, "userModified": False}
    out = await WriteTool().call({"file_path": str(target), "content": "one\ntwo\n"}, ctx)
    assert out.structured == {"type": "update", "filePath": str(target), "content": "one\ntwo\n",
                              "structuredPatch": structured_patch("one\n", "one\ntwo\n"), "originalFile": "one\n",
                              "userModified": False}
    assert out.structured["structuredPatch"] != []


class _WriteOnly(NoFileRules):
    def denial(self, path: str, access: str) -> AccessDenial | None:
        return AccessDenial(path, "Read(secret)") if access == "read" else None


async def test_a_file_that_may_not_be_read_shows_no_old_text(tmp_path: Path) -> None:
    target = tmp_path / "secret.txt"
    target.write_text("hidden\n")
    ctx = ToolContext(cwd=tmp_path, file_access=_WriteOnly())
    ctx.read_files[str(target)] = target.stat().st_mtime
    out = await WriteTool().call({"file_path": str(target), "content": "new\n"}, ctx)
    assert out.structured["type"] == "update"
    assert out.structured["originalFile"] is None and out.structured["structuredPatch"] == []
    assert target.read_text() == "new\n"


async def test_an_original_that_is_not_utf8_is_shown_with_replacement_characters(ctx: ToolContext,
                                                                                   tmp_path: Path) -> None:
    target = tmp_path / "latin1.txt"
    target.write_bytes(b"caf\xe9\n")
    await ReadTool().call({"file_path": str(target)}, ctx)
    out = await WriteTool().call({"file_path": str(target), "content": "cafe\n"}, ctx)
    assert out.structured["originalFile"] == "caf\ufffd\n"


@pytest.mark.parametrize("existed", [False, True])
async def test_content_the_user_modified_is_said_so_without_the_file_state_note(existed: bool,
                                                                                tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), user_modified=True)
    if existed:
        target.write_text("old")
        ctx.read_files[str(target)] = target.stat().st_mtime
    out = await WriteTool().call({"file_path": str(target), "content": "mine"}, ctx)
    verb = f"The file {target} has been updated successfully." if existed else f"File created successfully at: {target}"
    assert out.data == f"{verb} The user modified your proposed content before accepting it."
    assert out.structured["userModified"] is True and out.structured["type"] == ("update" if existed else "create")


async def test_a_write_that_fails_says_why_in_the_systems_words(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("a file, not a directory")
    target = tmp_path / "plain" / "new.txt"
    with pytest.raises(ToolError) as err:
        await write(ctx, target, "x")
    assert str(err.value) == f"Could not write {target}: File exists"  # mkdir of its parent, a file


async def test_the_file_is_utf8_whatever_the_locale(ctx: ToolContext, tmp_path: Path) -> None:
    import locale

    target = tmp_path / "u.txt"
    before = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale, as under LANG=C without coercion
        await write(ctx, target, "café ☕\n")
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert target.read_bytes() == "café ☕\n".encode()


class _VanishesOnCheck(NoFileRules):
    """Deletes the file when asked whether it may be read: another process removing it between the
    write's checks and its reading of the old text."""

    def denial(self, path: str, access: str) -> AccessDenial | None:
        if access == "read":
            Path(path).unlink(missing_ok=True)
        return None


async def test_a_file_gone_before_its_old_text_is_read_is_written_anew(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    ctx = ToolContext(cwd=tmp_path, file_access=_VanishesOnCheck())
    ctx.read_files[str(target)] = target.stat().st_mtime
    out = await WriteTool().call({"file_path": str(target), "content": "new"}, ctx)
    assert out.structured["originalFile"] is None and target.read_text() == "new"
