"""Read: line numbering, paging, warnings, errors and the read state it leaves for Edit/Write."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.read import DEFAULT_LIMIT, EMPTY_FILE_WARNING, MAX_LINE_CHARS, ReadTool, render


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


async def read(ctx: ToolContext, file_path: str | Path, **kw: int) -> str:
    out = await ReadTool().call({"file_path": str(file_path), **kw}, ctx)
    assert not out.is_error
    return out.data


async def test_lines_are_numbered_from_one_with_a_tab(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\nbeta\n\ngamma\n")
    # Claude Code numbers the (empty) line after a final newline
    assert await read(ctx, tmp_path / "a.txt") == "1\talpha\n2\tbeta\n3\t\n4\tgamma\n5\t"


async def test_no_padding_for_large_line_numbers(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "n.txt").write_text("".join(f"l{i}\n" for i in range(1, 1201)))
    out = await read(ctx, tmp_path / "n.txt", offset=999, limit=3)
    assert out == "999\tl999\n1000\tl1000\n1001\tl1001"


async def test_offset_and_limit(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1\n2\n3\n4\n5\n")
    assert await read(ctx, tmp_path / "a.txt", offset=2, limit=2) == "2\t2\n3\t3"
    assert await read(ctx, tmp_path / "a.txt", offset=0, limit=1) == "1\t1"
    assert await read(ctx, tmp_path / "a.txt", offset=5) == "5\t5\n6\t"


async def test_default_limit_is_2000_lines_with_a_paging_note(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    out = await read(ctx, tmp_path / "big.txt")
    body, note = out.split("\n\n")
    assert body.splitlines()[-1] == f"{DEFAULT_LIMIT}\t{DEFAULT_LIMIT}"
    assert len(body.splitlines()) == DEFAULT_LIMIT
    assert note == "[Showing lines 1-2000 of 2501. Call Read with offset=2001 to read further.]"
    # an explicit limit is the caller's choice: no note
    assert "\n\n" not in await read(ctx, tmp_path / "big.txt", limit=5)


async def test_long_lines_are_cut_with_a_note(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "wide.txt").write_text("x" * 5000 + "\nshort\n")
    first, second, last = (await read(ctx, tmp_path / "wide.txt")).split("\n")
    assert last == "3\t"
    assert first == f"1\t{'x' * MAX_LINE_CHARS}... [line truncated: 5000 characters]"
    assert second == "2\tshort"


async def test_a_line_of_exactly_the_cap_is_shown_whole(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "edge.txt").write_text("y" * MAX_LINE_CHARS + "\n" + "z" * (MAX_LINE_CHARS + 1) + "\n")
    first, second = (await read(ctx, tmp_path / "edge.txt")).split("\n")[:2]
    assert first == f"1\t{'y' * MAX_LINE_CHARS}"
    assert second == f"2\t{'z' * MAX_LINE_CHARS}... [line truncated: {MAX_LINE_CHARS + 1} characters]"


async def test_empty_file_gives_the_warning_reminder(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    assert await read(ctx, tmp_path / "empty.txt") == (
        "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>")
    assert await read(ctx, tmp_path / "empty.txt", offset=10) == EMPTY_FILE_WARNING


async def test_offset_past_the_end_says_how_many_lines(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\nb\nc\n")
    assert await read(ctx, tmp_path / "a.txt", offset=10) == (
        "<system-reminder>Warning: the file exists but is shorter than the provided offset (10). "
        "The file has 4 lines.</system-reminder>")  # Claude Code counts the line after the final newline


async def test_missing_file_is_a_tool_error(ctx: ToolContext, tmp_path: Path) -> None:
    with pytest.raises(ToolError) as err:
        await ReadTool().call({"file_path": str(tmp_path / "missing.txt")}, ctx)
    assert str(err.value) == f"File does not exist. Note: your current working directory is {tmp_path}."


async def test_missing_file_suggests_a_same_stem_file(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "main.ts").write_text("x")
    with pytest.raises(ToolError, match=r"File does not exist\..* Did you mean .*main\.ts\?"):
        await ReadTool().call({"file_path": str(tmp_path / "main.js")}, ctx)


async def test_directory_is_an_error(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(ToolError, match="is a directory"):
        await ReadTool().call({"file_path": str(tmp_path / "d")}, ctx)


async def test_binary_file_is_refused(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "blob.dat").write_bytes(b"abc\0def")
    with pytest.raises(ToolError, match="cannot read binary files"):
        await ReadTool().call({"file_path": str(tmp_path / "blob.dat")}, ctx)
    (tmp_path / "x.zip").write_bytes(b"PK")
    with pytest.raises(ToolError, match=r"binary \.zip file"):
        await ReadTool().call({"file_path": str(tmp_path / "x.zip")}, ctx)


async def test_image_comes_back_as_an_image_block(ctx: ToolContext, tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    (tmp_path / "p.png").write_bytes(png)
    out = await ReadTool().call({"file_path": str(tmp_path / "p.png")}, ctx)
    [block] = out.data
    assert block["type"] == "image"
    assert block["source"] == {"type": "base64", "media_type": "image/png",
                               "data": base64.b64encode(png).decode()}
    assert ReadTool().map_result(out, "t1")["content"] == [block]


async def test_crlf_and_bom_are_not_shown(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    assert await read(ctx, tmp_path / "w.txt") == "1\tone\n2\ttwo\n3\t"


async def test_relative_path_resolves_against_cwd(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "r.txt").write_text("rel\n")
    assert await read(ctx, "sub/r.txt") == "1\trel\n2\t"


async def test_success_records_the_mtime(ctx: ToolContext, tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("x\n")
    await read(ctx, f)
    assert ctx.read_files[str(f)] == f.stat().st_mtime
    (tmp_path / "e.txt").write_text("")
    await read(ctx, tmp_path / "e.txt")
    assert str(tmp_path / "e.txt") in ctx.read_files


async def test_failed_read_records_nothing(ctx: ToolContext, tmp_path: Path) -> None:
    with pytest.raises(ToolError):
        await ReadTool().call({"file_path": str(tmp_path / "nope")}, ctx)
    assert ctx.read_files == {}


def test_tool_traits_and_schema() -> None:
    t = ReadTool()
    assert t.name == "Read"
    assert t.is_concurrency_safe({}) and t.is_read_only({})
    assert t.interrupt_behavior() == "cancel"
    schema = t.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["file_path"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"file_path", "offset", "limit", "allow_large"}
    v = jsonschema.Draft202012Validator(schema)
    assert not v.is_valid({})
    assert not v.is_valid({"file_path": "/x", "extra": 1})
    assert v.is_valid({"file_path": "/x", "offset": 3, "limit": 10})
    assert t.permission_subject({"file_path": "/x"}) == "/x"


def _reference(lines: list[str], offset: int | None, limit: int | None) -> list[str]:
    start = max(offset or 1, 1)
    return [f"{n}\t{line}" for n, line in
            list(enumerate(lines, start=1))[start - 1:start - 1 + (limit or DEFAULT_LIMIT)]]


# no line breaks, no NUL (binary) and no byte-order mark (dropped on reading)
line_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                           blacklist_characters="\r\n\x00\ufeff"), max_size=12)


@given(lines=st.lists(line_text, min_size=1, max_size=40), offset=st.none() | st.integers(0, 45),
       limit=st.none() | st.integers(1, 45))
def test_render_slices_like_the_reference(lines: list[str], offset: int | None, limit: int | None) -> None:
    out = render(lines, offset, limit)
    start = max(offset or 1, 1)
    if start > len(lines):
        assert f"The file has {len(lines)} lines." in out
        return
    assert out.split("\n") == _reference(lines, offset, limit)


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(line_text, min_size=1, max_size=30), offset=st.none() | st.integers(1, 35),
       limit=st.none() | st.integers(1, 35), final_newline=st.booleans())
def test_reading_a_file_matches_the_reference(lines: list[str], offset: int | None, limit: int | None,
                                              final_newline: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "f.txt")
        # A final newline opens one more, empty line (Claude Code numbers it too).
        path.write_bytes(("\n".join(lines) + ("\n" if final_newline else "")).encode("utf-8"))
        lines = [*lines, ""] if final_newline else lines
        inp: dict[str, object] = {"file_path": str(path)}
        if offset is not None:
            inp["offset"] = offset
        if limit is not None:
            inp["limit"] = limit
        out = asyncio.run(ReadTool().call(inp, ToolContext(cwd=Path(d), file_access=NoFileRules()))).data
        if path.stat().st_size == 0:
            assert out == EMPTY_FILE_WARNING
        elif (offset or 1) > len(lines):
            assert "shorter than the provided offset" in out
        else:
            assert out.split("\n") == _reference(lines, offset, limit)


# --- resource guards: special files, the size cap, ranges of huge files -----------------------------


async def test_devices_fifos_and_sockets_are_refused_without_blocking(ctx: ToolContext, tmp_path: Path) -> None:
    import os
    import socket

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        for path, kind in (("/dev/zero", "a device"), (fifo, "a FIFO"), (sock_path, "a socket"),
                           ("/dev/urandom", "a device")):
            with pytest.raises(ToolError, match=f"is {kind}, not a regular file"):
                await asyncio.wait_for(ReadTool().call({"file_path": str(path)}, ctx), 5)
    finally:
        server.close()


async def test_a_file_over_the_cap_is_refused_with_claude_codes_text(ctx: ToolContext, tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text(("x" * 379 + "\n") * 1000)  # 380,000 bytes, 1000 lines
    with pytest.raises(ToolError) as err:
        await ReadTool().call({"file_path": str(big)}, ctx)
    assert str(err.value) == (
        "File content (371.1KB) exceeds maximum allowed size (256KB). Use offset and limit parameters to read "
        "specific portions of the file, or search for specific content instead of reading the whole file. To "
        "read it anyway, up to what still fits in your context, call Read again with allow_large: true \u2014 "
        "only if you genuinely need all of it or the user asked for the whole file.")
    # a range is read without the cap, and so is the whole file with allow_large
    assert await read(ctx, big, offset=1, limit=3) == "\n".join(f"{i}\t{'x' * 379}" for i in (1, 2, 3))
    out = await ReadTool().call({"file_path": str(big), "allow_large": True}, ctx)
    assert out.data.startswith("1\t") and "1000\t" in out.data
    # the cap is a setting
    assert "(1KB)" in str(await _error(ReadTool(max_bytes=1024), ctx, big))


async def _error(tool: ReadTool, ctx: ToolContext, path: Path) -> ToolError:
    with pytest.raises(ToolError) as err:
        await tool.call({"file_path": str(path)}, ctx)
    return err.value


@pytest.mark.slow
async def test_a_range_of_a_huge_file_costs_the_range_not_the_file(ctx: ToolContext, tmp_path: Path) -> None:
    import resource

    huge = tmp_path / "huge.txt"
    with huge.open("wb") as fh:
        line = b"y" * 99 + b"\n"
        for _ in range(200):
            fh.write(line * 10_000)  # 200 MB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = await read(ctx, huge, offset=1_000_000, limit=2000)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert out.startswith("1000000\t") and out.count("\n") == 1999
    assert grown_kb < 64 * 1024, f"reading 2000 lines grew the process by {grown_kb} KB"
