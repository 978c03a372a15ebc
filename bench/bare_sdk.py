"""The bare-SDK peer of ``agentfsm -p`` (issue 34): the read probe's two streaming requests made with
nothing but ``anthropic.AsyncAnthropic`` — a Read tool, its call run, the answer printed. bench/cli.py
runs it as a child beside ``agentfsm -p`` against the same loopback server: what the SDK alone costs.

    ANTHROPIC_BASE_URL=... ANTHROPIC_API_KEY=... python bench/bare_sdk.py PROMPT
"""

import asyncio
import sys
import uuid
from pathlib import Path

import anthropic

READ = {"name": "Read", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}


async def main(prompt: str) -> str:
    client = anthropic.AsyncAnthropic()
    messages: list = [{"role": "user", "content": prompt}]
    metadata = {"user_id": str(uuid.uuid4())}  # the scripted server counts requests per user_id
    while True:
        async with client.messages.stream(model="claude-sonnet-4-5", max_tokens=32000, messages=messages,
                                          tools=[READ], metadata=metadata) as stream:
            message = await stream.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        if message.stop_reason != "tool_use":
            await client.close()
            return "".join(b.text for b in message.content if b.type == "text")
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": Path(b.input["file_path"]).read_text()}
                   for b in message.content if b.type == "tool_use"]
        messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1])))
