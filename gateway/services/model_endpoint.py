"""OpenAI-compatible endpoint client (LM Studio, Ollama, llama.cpp, vLLM).

One client for summaries, token-count calibration and context-window discovery. After a
connection failure it backs off (15 s): callers get `LLMUnavailable` at once and use their
fallback, so a 200-chunk job does not wait on 200 timeouts.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2

from gateway.services.files import atomic_write
from gateway.services.tokens import ESTIMATOR, TokenEstimator, estimate_tokens, raw_estimate
from gateway.settings import LLMSettings

log = logging.getLogger("gateway.model_endpoint")

BACKOFF_SECONDS = 15.0
SLOPE_RANGE = (0.2, 3.0)  # calibrated scale vs the built-in estimate; outside = a broken endpoint
# Safety margin per kind on a calibrated rate: real windows run above the calibration sample's rate by
# up to this much (the 99.5th percentile over bench/tokens.py's 25-kind corpus, each of cl100k, o200k,
# Qwen 3.6 and Llama 3 taken in turn as the user's model).
MARGIN = {"prose": 1.06, "code": 1.2, "json": 1.19, "cjk": 1.1}
ONE_PASS_TOKENS = 6000
SLICE_TOKENS = 3000

# One sample unit per content kind; calibration sends it 2 and 20 times (the slope cancels the
# chat template's fixed cost).
SAMPLES = {
    "prose": (
        "The gateway keeps large tool results out of the model's context window. When a result is larger "
        "than 256 KB or 1,500 tokens, it is saved to a file, and the model receives a short reference with "
        "an outline instead. Read the outline first; then take only the part you need, e.g. one record, "
        "a line range, or the matches of a search. Files older than 48 hours are removed at start-up.\n"
    ),
    "code": (
        "def load_rows(path: str, limit: int = 10) -> list[dict[str, object]]:\n"
        '    """Read a JSONL file and return the first `limit` rows."""\n'
        "    rows = []\n"
        '    with open(path, encoding="utf-8") as fh:\n'
        "        for line in fh:\n"
        "            if line.strip():\n"
        "                rows.append(json.loads(line))  # skip blank lines\n"
        "            if len(rows) >= limit:\n"
        "                break\n"
        "    return rows\n\n"
    ),
    "json": (
        '{"id": "9f3a61c2b7d04e18", "createdAt": "2026-11-30T09:12:44Z", "status": "shipped", '
        '"user": {"login": "minsu_kim", "score": 71.25, "verified": true}, "tags": ["priority", "gift"], '
        '"amount": 129500, "ok": true, "message": "Leave the parcel at the front desk", "discount": null, '
        '"url": "https://api.example.com/v2/orders/48213?expand=items"},\n'
    ),
    "cjk": (
        "게이트웨이는 너무 큰 결과를 파일로 옮기고, 모델에는 짧은 참조와 개요만 전달합니다. "
        "세션 메모리에 목표를 고정해 두면 대화가 길어져도 중요한 내용을 다시 불러올 수 있습니다. "
        "응답이 1 MB를 넘으면 저장되고, 오래된 파일은 48시간 뒤에 지워집니다. "
        "검색어에 특수 문자가 들어 있어도 오류 없이 결과를 돌려주어야 합니다.\n"
    ),
}


class LLMUnavailable(Exception):
    """The endpoint is down or backing off; use the fallback."""


class ModelEndpoint:
    def __init__(self, settings: LLMSettings, workspace: Path, estimator: TokenEstimator = ESTIMATOR):
        self.settings = settings
        self.tokens = estimator  # calibration installs its measured rates here
        self.workspace = workspace
        self.base_url = settings.base_url.rstrip("/")
        self.root = self.base_url.removesuffix("/v1")
        self._http: httpx2.AsyncClient | None = None
        self._down_until = 0.0
        self.last_error = ""
        self.model = settings.model
        self.window: int | None = None
        self.window_source = ""
        self.calibration: dict[str, Any] | None = None
        self.started = anyio.Event()  # set when start() has finished, whatever its outcome

    # -- transport ------------------------------------------------------------------------

    def _client(self) -> httpx2.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
            self._http = httpx2.AsyncClient(
                headers=headers, timeout=httpx2.Timeout(self.settings.timeout_seconds, connect=5.0)
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def request(self, method: str, url: str, payload: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """JSON request; None for a 4xx (route not offered); LLMUnavailable when down (and backs off)."""
        if not self.available:
            raise LLMUnavailable(f"not tried again yet after {self.last_error}")
        try:
            response = await self._client().request(method, url, json=payload)
        except (httpx2.TransportError, OSError) as exc:
            self._down_until = time.monotonic() + BACKOFF_SECONDS
            self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise LLMUnavailable(f"cannot reach {url}: {self.last_error}") from None
        if 400 <= response.status_code < 500:
            return None
        if response.status_code >= 500:
            self._down_until = time.monotonic() + BACKOFF_SECONDS
            self.last_error = f"HTTP {response.status_code}"
            raise LLMUnavailable(f"{url} answered HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            return None
        return data if isinstance(data, dict) else {"data": data}

    # -- chat and summaries ------------------------------------------------------------------

    async def resolve_model(self) -> str:
        if self.model:
            return self.model
        data = await self.request("GET", f"{self.base_url}/models")
        ids = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict) and m.get("id")]
        self.model = ids[0] if ids else ""
        return self.model

    async def chat(self, messages: list[dict[str, str]], max_tokens: int = 512) -> tuple[str, dict[str, Any]]:
        model = await self.resolve_model()
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        data = await self.request("POST", f"{self.base_url}/chat/completions", body)
        if not data or not data.get("choices"):
            raise LLMUnavailable(f"{self.base_url}/chat/completions gave no choices (is a model loaded?)")
        text = (data["choices"][0].get("message") or {}).get("content") or ""
        return text, data.get("usage") or {}

    async def summarize(self, text: str, instruction: str, max_tokens: int = 800) -> str:
        """One pass for short input; sequential map-reduce over slices for long input."""
        if estimate_tokens(text) <= ONE_PASS_TOKENS:
            return await self._summarize_once(text, instruction, max_tokens)
        partials = [
            await self._summarize_once(piece, instruction, max_tokens) for piece in split_by_tokens(text, SLICE_TOKENS)
        ]
        return await self.summarize("\n\n".join(partials), instruction, max_tokens)

    async def _summarize_once(self, text: str, instruction: str, max_tokens: int) -> str:
        messages = [{"role": "system", "content": instruction}, {"role": "user", "content": text}]
        summary, _ = await self.chat(messages, max_tokens)
        return summary.strip()  # empty: the endpoint answered, and the summary gate says what is wrong

    # -- calibration ------------------------------------------------------------------------------

    @property
    def _cache_path(self) -> Path:
        return self.workspace / "calibration.json"

    def _cache_key(self) -> str:
        return f"{self.base_url}|{self.model}"

    def load_cached_calibration(self) -> bool:
        try:
            cache = json.loads(self._cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        entry = cache.get(self._cache_key()) if isinstance(cache, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("scales"), dict):
            return False
        self.calibration = entry
        self.tokens.set_scales(entry["scales"])
        return True

    def _save_calibration(self, entry: dict[str, Any]) -> None:
        try:
            cache = json.loads(self._cache_path.read_text(encoding="utf-8"))
            cache = cache if isinstance(cache, dict) else {}
        except (OSError, ValueError):
            cache = {}
        cache[self._cache_key()] = entry
        atomic_write(self._cache_path, json.dumps(cache, indent=2))

    async def exact_count(self, text: str) -> int | None:
        """Exact token count where the server offers one (llama.cpp and vLLM `POST /tokenize`)."""
        data = await self.request("POST", f"{self.root}/tokenize", {"content": text, "model": self.model})
        if data is None:
            data = await self.request("POST", f"{self.root}/tokenize", {"prompt": text, "model": self.model})
        if not data:
            return None
        if isinstance(data.get("count"), int):
            return data["count"]
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None

    async def _prompt_tokens(self, text: str) -> int | None:
        _, usage = await self.chat([{"role": "user", "content": text}], max_tokens=1)
        value = usage.get("prompt_tokens")
        return value if isinstance(value, int) else None

    async def calibrate(self) -> dict[str, Any] | None:
        """Measure the model's rate per content kind; install it and cache it in the workspace."""
        await self.resolve_model()
        scales: dict[str, float] = {}
        method = "tokenize"
        for kind, unit in SAMPLES.items():
            long_text = unit * 20
            exact = await self.exact_count(long_text)
            if exact is not None:
                scale = exact / raw_estimate(long_text)
            else:
                method = "slope"
                short_text = unit * 2
                a, b = await self._prompt_tokens(short_text), await self._prompt_tokens(long_text)
                if a is None or b is None:
                    log.info(
                        "calibration: %s reports no usage.prompt_tokens; keeping the built-in estimate", self.base_url
                    )
                    return None
                scale = (b - a) / (raw_estimate(long_text) - raw_estimate(short_text))
            if not SLOPE_RANGE[0] <= scale <= SLOPE_RANGE[1]:
                log.warning(
                    "calibration: absurd %s rate %.3f from %s; keeping the built-in estimate",
                    kind,
                    scale,
                    self.base_url,
                )
                return None
            scales[kind] = round(scale * MARGIN[kind], 4)
        entry = {"scales": scales, "method": method, "model": self.model, "at": int(time.time())}
        self.tokens.set_scales(scales)
        self.calibration = entry
        self._save_calibration(entry)
        log.info("calibrated token rates against %s (%s, %s): %s", self.base_url, self.model or "?", method, scales)
        return entry

    # -- window discovery -------------------------------------------------------------------------

    async def discover_window(self) -> int | None:
        """The model's real context window: llama.cpp /props, LM Studio /api/v0/models, Ollama /api/show."""
        props = await self.request("GET", f"{self.root}/props")
        if props:
            n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
            if isinstance(n_ctx, int) and n_ctx > 0:
                return self._found(n_ctx, "llama.cpp /props n_ctx")
        lmstudio = await self.request("GET", f"{self.root}/api/v0/models")
        if lmstudio and isinstance(lmstudio.get("data"), list):
            models = [m for m in lmstudio["data"] if isinstance(m, dict)]
            chosen = next((m for m in models if self.model and m.get("id") == self.model), None) or next(
                (m for m in models if m.get("state") == "loaded"), None
            )
            if chosen:
                value = chosen.get("loaded_context_length") or chosen.get("max_context_length")
                if isinstance(value, int) and value > 0:
                    self.model = self.model or chosen.get("id", "")
                    return self._found(value, "LM Studio /api/v0/models")
        model = await self.resolve_model()
        if model:
            show = await self.request("POST", f"{self.root}/api/show", {"model": model})
            if show:
                for line in str(show.get("parameters") or "").splitlines():
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
                        return self._found(int(parts[1]), "Ollama /api/show num_ctx")
                info = show.get("model_info") or {}
                lengths = [v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)]
                if lengths:
                    # Ollama runs with num_ctx (default 4096) unless the model file sets it.
                    return self._found(min(lengths[0], 4096), "Ollama default num_ctx 4096 (model allows more)")
        return None

    def _found(self, window: int, source: str) -> int:
        self.window, self.window_source = window, source
        log.info("context window %d tokens (%s)", window, source)
        return window

    async def start(self) -> None:
        """Background start-up: cached calibration, window discovery, calibration. Never raises."""
        try:
            self.load_cached_calibration()
            with anyio.fail_after(self.settings.timeout_seconds):
                await self.discover_window()
                stale = self.calibration is None or self.calibration.get("model") != self.model
                if stale and not self.load_cached_calibration():
                    await self.calibrate()
        except (LLMUnavailable, TimeoutError) as exc:
            log.info("model endpoint not used now: %s", exc)
        except Exception:
            log.exception("model endpoint start-up failed; the built-in estimate stays in use")
        finally:
            self.started.set()

    def describe(self) -> str:
        """One line for `inspect` and `context_status`."""
        if self.tokens.family != "auto":
            counts = f"{self.tokens.describe()} ([gateway] tokenizer)"
        elif self.calibration:
            rates = ", ".join(f"{k} x{v:.2f}" for k, v in self.tokens.scales().items())
            counts = f"calibrated ({self.calibration.get('method')}) against {self.model or '?'}: {rates}"
        else:
            counts = (
                f"{self.tokens.describe()}; not calibrated: no model endpoint answered at "
                f"{self.base_url} (set [gateway] tokenizer to count for your host's)"
            )
        window = f"window {self.window} ({self.window_source})" if self.window else "window not discovered"
        return f"token counts: {counts}; {window}"

    def status(self) -> dict[str, Any]:
        return {
            "endpoint": self.base_url,
            "model": self.model or "(whatever is loaded)",
            "calibrated": bool(self.calibration),
            "method": (self.calibration or {}).get("method", "built-in estimate"),
            "scales": self.tokens.scales(),
            "window": self.window,
            "window_source": self.window_source or "not discovered",
            "available": self.available,
        }


def split_by_tokens(text: str, limit: int) -> list[str]:
    """Consecutive pieces of whole lines, each about `limit` tokens (a longer line is cut)."""
    pieces: list[str] = []
    current: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        cost = estimate_tokens(line)
        while cost > limit:  # one huge line: cut it by characters
            cut = max(1, len(line) * limit // cost)
            pieces.append(line[:cut])
            line = line[cut:]
            cost = estimate_tokens(line)
        if used + cost > limit and current:
            pieces.append("".join(current))
            current, used = [], 0
        current.append(line)
        used += cost
    if current:
        pieces.append("".join(current))
    return pieces
