"""Claude Code's output contract and command line, as the Agent SDK and shell users rely on them:
usage errors, ``--version``, ``--output-format json --verbose``, ``api_retry`` events, a closed
stdout, the raw control protocol, and ``--mcp-config`` servers (stdio, http) run as tools."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentfsm.testing import ScriptedServer, canonical_requests

pytestmark = pytest.mark.slow

OVERLOADED = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.01}


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn", **kw}


def agentfsm(*args: str, cwd: Path, home: Path, stdin: str = "", env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentfsm", *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=timeout,
                          env={**os.environ, "AGENTFSM_HOME": str(home), "HOME": str(home), **(env or {})})


def scenario_file(tmp_path: Path, responses: list[dict[str, Any]]) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"responses": responses}))
    return str(path)


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize(("argv", "expect"), [
    (["--dangerously", "-p", "hi"], "unrecognized arguments: --dangerously"),  # no abbreviated options
    (["diagarm"], "did you mean `agentfsm diagram`"),
    (["-p", "hi", "--cwd", "/no/such/dir"], "--cwd /no/such/dir: no such directory"),
    (["-p", "hi", "--json-schema", '{"type": 12}'], "--json-schema is not a valid JSON Schema"),
    (["-p", "hi", "--output-format", "xml"], "invalid choice: 'xml'"),
    (["-p", "hi", "--input-format", "stream-json", "--output-format", "json"], "requires output-format=stream-json"),
    (["-p", "hi", "--mcp-config", "{not json"], "Invalid MCP configuration:\nMCP config file not found"),
    (["-p", "hi", "--mcp-config", '{"tiny": {"command": "x"}}'], "mcpServers: Invalid input: expected record"),
    (["-p", "hi", "--task-budget", "0"], "--task-budget: expected a positive whole number, got '0'"),
    (["-p", "hi", "--session-mirror"], "--session-mirror (the Agent SDK's session_store) is not supported"),
    (["-p", "hi", "--resume-session-at=m1"], "--resume-session-at/--resume-drops-turn are not supported"),
    (["-p", "hi", "--task-budget", "9", "--temporal", "127.0.0.1:1"], "--task-budget is not supported with --temporal"),
])
def test_usage_errors_exit_1_and_print_nothing(tmp_path: Path, argv: list[str], expect: str) -> None:
    proc = agentfsm(*argv, cwd=tmp_path, home=tmp_path / "home")
    assert proc.returncode == 1 and proc.stdout == ""
    assert expect in proc.stderr


def test_version(tmp_path: Path) -> None:
    from agentfsm import __version__

    proc = agentfsm("--version", cwd=tmp_path, home=tmp_path / "home")
    assert (proc.returncode, proc.stdout) == (0, f"{__version__} (agentfsm)\n")


def test_json_verbose_prints_every_message_as_one_array(tmp_path: Path) -> None:
    proc = agentfsm("-p", "hi", "--output-format", "json", "--verbose", "--scripted",
                    scenario_file(tmp_path, [text("HELLO")]), cwd=tmp_path, home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    messages = json.loads(proc.stdout)
    assert messages[0]["type"] == "system" and messages[0]["subtype"] == "init"
    assert messages[-1]["type"] == "result" and messages[-1]["result"] == "HELLO"
    assert any(m["type"] == "assistant" for m in messages)


def test_result_and_init_fields_the_sdk_reads(tmp_path: Path) -> None:
    proc = agentfsm("-p", "hi", "--output-format", "stream-json", "--verbose", "--scripted",
                    scenario_file(tmp_path, [text("HELLO")]), cwd=tmp_path, home=tmp_path / "home")
    out = lines(proc.stdout)
    init, result = out[0], out[-1]
    assert isinstance(init["claude_code_version"], str) and isinstance(init["uuid"], str)
    assert isinstance(init["mcp_servers"], list) and isinstance(init["tools"], list)
    types = {"subtype": str, "duration_ms": int, "duration_api_ms": int, "is_error": bool, "num_turns": int,
             "session_id": str, "stop_reason": str, "total_cost_usd": float, "usage": dict, "modelUsage": dict,
             "permission_denials": list, "uuid": str, "terminal_reason": str, "result": str}
    assert {k: type(result[k]) for k in types} == types
    assert result["api_error_status"] is None
    usage = result["modelUsage"]["claude-sonnet-4-5"]
    assert usage["inputTokens"] > 0 and usage["costUSD"] == pytest.approx(result["total_cost_usd"])
    assert all(isinstance(m.get("uuid"), str) for m in out if m["type"] in ("system", "assistant", "result"))


def test_api_retry_events_and_in_process_agrees_with_the_server(tmp_path: Path) -> None:
    """A 529 twice, then an answer: two ``api_retry`` events and a success, in-process (``--scripted``)
    and over the loopback server alike."""
    responses = [OVERLOADED, OVERLOADED, text("FINE")]
    args = ["-p", "hi", "--output-format", "stream-json", "--verbose", "--tools", "Read"]
    scripted = agentfsm(*args, "--scripted", scenario_file(tmp_path, responses), cwd=tmp_path, home=tmp_path / "h1")
    with ScriptedServer(responses) as server:
        wire = agentfsm(*args, cwd=tmp_path, home=tmp_path / "h2",
                        env={"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test"})
        assert len(server.requests) == 3
    for proc in (scripted, wire):
        out = lines(proc.stdout)
        retries = [m for m in out if m.get("subtype") == "api_retry"]
        assert [(r["attempt"], r["max_retries"], r["error_status"], r["error"]) for r in retries] == [
            (1, 10, 529, "overloaded"), (2, 10, 529, "overloaded")]
        assert all(isinstance(r["retry_delay_ms"], int) for r in retries)
        assert (out[-1]["subtype"], out[-1]["result"], proc.returncode) == ("success", "FINE", 0)


def test_api_error_after_the_retries_reports_its_status(tmp_path: Path) -> None:
    proc = agentfsm("-p", "hi", "--output-format", "stream-json", "--verbose", "--limit", "api_max_retries=1",
                    "--scripted", scenario_file(tmp_path, [OVERLOADED, OVERLOADED, text("never")]),
                    cwd=tmp_path, home=tmp_path / "home")
    out = lines(proc.stdout)
    assert len([m for m in out if m.get("subtype") == "api_retry"]) == 1
    assert (out[-1]["terminal_reason"], out[-1]["api_error_status"], proc.returncode) == ("api_error", 529, 1)


def test_a_closed_stdout_ends_the_run_quietly_and_the_session_file_has_the_result(tmp_path: Path) -> None:
    home = tmp_path / "home"
    slow = {"blocks": [{"type": "text", "text": f"PART{i}"} for i in range(4)], "stop_reason": "end_turn",
            "block_delay_s": 0.5}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentfsm", "-p", "hi", "--output-format", "stream-json", "--verbose",
         "--scripted", scenario_file(tmp_path, [slow])],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "AGENTFSM_HOME": str(home), "HOME": str(home)})
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=30)
    assert first["subtype"] == "init"
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    [trace] = list((home / "projects").glob(f"*/{first['session_id']}.jsonl"))
    results = [r for r in map(json.loads, trace.read_text().splitlines()) if r["type"] == "result"]
    assert len(results) == 1


class Sdk:
    """The SDK's side of the control protocol, spoken by hand over a CLI's stdin/stdout."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        home = tmp_path / "home"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentfsm", "--output-format", "stream-json", "--verbose", *args,
             "--input-format", "stream-json"],
            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "AGENTFSM_HOME": str(home), "HOME": str(home), **(env or {})})
        self.seen: list[dict[str, Any]] = []
        self.n = 0

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        rid = f"req_{self.n}_test"
        self.send({"type": "control_request", "request_id": rid, "request": request})
        return self.until(lambda m: m["type"] == "control_response" and m["response"]["request_id"] == rid)["response"]

    def until(self, pred: Any) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            self.seen.append(msg)
            if pred(msg):
                return msg
        raise AssertionError(f"stdout ended first; stderr: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def prompt(self, content: str) -> None:
        self.send({"type": "user", "session_id": "", "message": {"role": "user", "content": content},
                   "parent_tool_use_id": None})

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.seen += lines(self.proc.stdout.read())
        return self.proc.wait(timeout=30)


def test_control_requests_are_answered_and_unknown_ones_refused(tmp_path: Path) -> None:
    sdk = Sdk(tmp_path, "--scripted", scenario_file(tmp_path, [text("ONE"), text("TWO")]))
    init = sdk.request({"subtype": "initialize", "hooks": None})
    assert init["subtype"] == "success" and init["response"]["claude_code_version"]
    unknown = sdk.request({"subtype": "rewind_files", "user_message_id": "u"})
    assert unknown["subtype"] == "error" and "rewind_files" in unknown["error"]
    bad_mode = sdk.request({"subtype": "set_permission_mode", "mode": "yolo"})
    assert (bad_mode["subtype"], bad_mode["error_code"]) == ("error", "invalid_mode")
    mode = sdk.request({"subtype": "set_permission_mode", "mode": "acceptEdits"})
    assert mode["response"] == {"mode": "acceptEdits"}
    model = sdk.request({"subtype": "set_model", "model": "claude-haiku-4-5"})
    assert model["response"] == {"model": "claude-haiku-4-5"}
    assert sdk.request({"subtype": "mcp_status"})["response"] == {"mcpServers": []}
    sdk.prompt("first")
    first = sdk.until(lambda m: m["type"] == "result")
    sdk.prompt("second")
    second = sdk.until(lambda m: m["type"] == "result")
    assert sdk.close() == 0
    assert (first["result"], second["result"]) == ("ONE", "TWO")
    inits = [m for m in sdk.seen if m.get("subtype") == "init"]
    assert [(i["model"], i["permissionMode"]) for i in inits] == [("claude-haiku-4-5", "acceptEdits")] * 2
    assert any(m.get("subtype") == "status" and m.get("permissionMode") == "acceptEdits" for m in sdk.seen)


def test_stdin_closed_at_once_prints_nothing(tmp_path: Path) -> None:
    proc = agentfsm("--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
                    "--scripted", scenario_file(tmp_path, [text("x")]), cwd=tmp_path, home=tmp_path / "home")
    assert (proc.returncode, proc.stdout) == (0, "")


@pytest.mark.parametrize("line", ["[" * 100_000, "9" * 5_000])
def test_a_stdin_line_nested_past_the_stack_is_an_invalid_message(tmp_path: Path, line: str) -> None:
    # json.loads raised RecursionError (and ValueError for 5,000 digits), not JSONDecodeError: a traceback
    user = json.dumps({"type": "user", "message": {"role": "user", "content": "hi"}})
    proc = agentfsm("--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
                    "--scripted", scenario_file(tmp_path, [text("x")]), cwd=tmp_path, home=tmp_path / "home",
                    stdin=f"{line}\n{user}\n")
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "not a stream-json user message" in proc.stderr


# --- MCP servers ----------------------------------------------------------------------------------

TINY_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("tiny")

@app.tool()
def echo(text: str) -> str:
    """Echo the text back with a prefix."""
    return f"ECHO:{text}"

@app.tool()
def boom(reason: str) -> str:
    """Always raises."""
    raise ValueError(f"BOOM:{reason}")

@app.tool(structured_output=False)
def multi(text: str) -> list[str]:
    """Two text blocks."""
    return [f"FIRST:{text}", f"SECOND:{text}"]

if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        app.run("stdio")
    else:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.server
def test_mcp_config_stdio_and_http_servers_are_tools(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    server_py = tmp_path / "tiny_server.py"
    server_py.write_text(TINY_SERVER)
    port = _free_port()
    http = subprocess.Popen([sys.executable, str(server_py), "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        config = {"mcpServers": {
            "tiny": {"command": sys.executable, "args": [str(server_py), "stdio"]},
            "tinyhttp": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"},
            "broken": {"command": str(tmp_path / "no-such-server")},
            "invalid": {"type": "stdio"}}}
        use = lambda i, name, inp: {"type": "tool_use", "id": i, "name": name, "input": inp}  # noqa: E731
        responses = [
            {"blocks": [use("toolu_echo", "mcp__tiny__echo", {"text": "hi"}),
                        use("toolu_boom", "mcp__tiny__boom", {"reason": "r"}),
                        use("toolu_multi", "mcp__tinyhttp__multi", {"text": "m"})], "stop_reason": "tool_use"},
            text("MCP_DONE"),
        ]
        with ScriptedServer(responses) as model:
            proc = agentfsm("-p", "use the mcp tools", "--output-format", "stream-json", "--verbose",
                            "--tools", "Read", "--allowedTools", "mcp__tiny,mcp__tinyhttp__multi",
                            "--mcp-config", json.dumps(config), "--strict-mcp-config", cwd=tmp_path,
                            home=tmp_path / "home",
                            env={"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "sk-test"})
            bodies = model.requests
    finally:
        http.terminate()
        http.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr
    out = lines(proc.stdout)
    init = out[0]
    assert init["mcp_servers"] == [{"name": "tiny", "status": "connected", "source": "dynamic"},
                                   {"name": "tinyhttp", "status": "connected", "source": "dynamic"},
                                   {"name": "broken", "status": "failed", "source": "dynamic"}]
    assert init["tools"][:1] == ["Read"] and "mcp__tinyhttp__echo" in init["tools"]
    echo_def = next(t for t in bodies[0]["tools"] if t["name"] == "mcp__tiny__echo")
    assert echo_def["input_schema"]["properties"]["text"]["type"] == "string"
    assert canonical_requests(bodies)[1][-3:] == ["res:toolu_boom:err", "res:toolu_echo:ok", "res:toolu_multi:ok"]
    sent = {b["tool_use_id"]: b for b in bodies[1]["messages"][-1]["content"] if b.get("type") == "tool_result"}
    assert sent["toolu_echo"]["content"] == '{"result":"ECHO:hi"}'  # structuredContent, compact JSON
    assert sent["toolu_boom"]["is_error"] is True and "boom" in sent["toolu_boom"]["content"]
    assert sent["toolu_multi"]["content"] == [{"type": "text", "text": "FIRST:m"}, {"type": "text", "text": "SECOND:m"}]
    assert out[-1]["result"] == "MCP_DONE"


def test_an_sdk_server_without_an_sdk_is_failed_and_the_run_goes_on(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    proc = agentfsm("-p", "hi", "--output-format", "stream-json", "--verbose", "--scripted",
                    scenario_file(tmp_path, [text("OK")]), "--mcp-config",
                    '{"mcpServers": {"fake": {"type": "sdk", "name": "fake"}}}', cwd=tmp_path, home=tmp_path / "home")
    out = lines(proc.stdout)
    assert out[0]["mcp_servers"] == [{"name": "fake", "status": "failed", "source": "sdk"}]
    assert (out[-1]["result"], proc.returncode) == ("OK", 0)


def test_mcp_config_parsing(tmp_path: Path) -> None:
    from agentfsm.tools.mcp import McpConfigError, parse_mcp_configs, tool_name

    (tmp_path / "a.json").write_text(json.dumps({"mcpServers": {"one": {"command": "x", "args": ["-y"]}}}))
    configs = parse_mcp_configs(["a.json", '{"mcpServers": {"two": {"type": "sse", "url": "http://h/sse"}, '
                                           '"one": {"type": "http", "url": "http://h/mcp", "headers": {"A": "1"}}}}'],
                                tmp_path)
    assert [(c.name, c.type) for c in configs] == [("one", "http"), ("two", "sse")]  # later wins, merged
    assert configs[0].headers == {"A": "1"}
    with pytest.raises(McpConfigError, match="not found"):
        parse_mcp_configs(["missing.json"], tmp_path)
    assert tool_name("my server", "do.it") == "mcp__my_server__do_it"
