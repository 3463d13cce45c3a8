# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A small OpenAI-compatible client on ``ansible.module_utils.urls`` (no third-party library).

Enough for the checks: GET a text page (``/metrics``), POST JSON (``/tokenize``) and stream a completion while
timing the first token. Every failure is an ``OpenAIHTTPError`` (a ``common.errors.CheckError`` that keeps the URL
and the HTTP status) whose ``str()`` is one sentence on one line,
whatever the server answers: bodies are read up to ``max_body_bytes``, and JSON answers of the wrong shape
(a stream chunk that is a list, a choice that is a string, a ``usage`` that is not an object, ``cached_tokens``
that is not a whole number) are refused with a sentence.

Requests go through ``ansible.module_utils.urls.Request`` (TLS verification, CA bundle, client certificate,
proxies from the environment). Where Ansible is not installed (the cluster verifier's Job runs in the engine's
image), or its ``Request`` takes no prepared TLS context (ansible-core before 2.17, which would build a new one, 0.15 s,
for every request and so for every measured time to first token), the same options are applied to the standard
library's ``urllib``, which ``Request`` is built on.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import math
import re
import socket
import time

try:  # Python 3
    from http.client import HTTPException
    from urllib.error import HTTPError, URLError
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover - Python 2 is not supported by the collection
    HTTPException = HTTPError = URLError = urlsplit = None

import ssl

from ..common.errors import CheckError

try:
    from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
    from ansible.module_utils.urls import Request, make_context
    HAS_ANSIBLE_URLS = True
except ImportError:  # the cluster verifier's Job: no Ansible in the engine image
    Request = make_context = None
    HAS_ANSIBLE_URLS = False

    class UrlsConnectionError(Exception):
        """Stands in for ``ansible.module_utils.urls.ConnectionError`` when Ansible is not installed."""


def _takes_context(request_class):
    """Whether ``Request`` accepts a prepared TLS context (ansible-core 2.17 and later)."""
    try:
        import inspect  # pylint: disable=import-outside-toplevel
        return "context" in inspect.signature(request_class).parameters
    except (TypeError, ValueError):
        return False


REQUEST_TAKES_CONTEXT = Request is not None and _takes_context(Request)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
USER_AGENT = "inference_cache.substrate"


class OpenAIHTTPError(CheckError):
    """A request failed; ``str(exc)`` is one sentence, ``status`` the HTTP status when there was one."""

    def __init__(self, message, url=None, status=None):
        super(OpenAIHTTPError, self).__init__(_one_line(message))
        self.url = url
        self.status = status


def _one_line(text, limit=None):
    text = " ".join(str(text).split())
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


def _reason(exc):
    """What went wrong, in words: the OS error text rather than ``[Errno 111]`` or an exception's class."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    elif reason:
        return _one_line(reason, 200).rstrip(".") or "the connection failed"
    if isinstance(exc, socket.timeout) or type(exc).__name__ in ("TimeoutError", "timeout"):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc)
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(text))  # OpenSSL's source location is no reason
    return _one_line(text, 200).rstrip(".") or "the connection failed"


def _stdlib_context(validate_certs=True, ca_path=None, client_cert=None, client_key=None):
    """The TLS context ``make_context`` would build, for a Python without Ansible."""
    context = ssl.create_default_context(cafile=ca_path)
    if client_cert:
        context.load_cert_chain(client_cert, client_key)
    if not validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _stdlib_open(method, url, data, headers, timeout, context, use_proxy=True):
    """``urllib`` with the options ``Request`` would apply, for a Python without Ansible."""
    import urllib.request  # pylint: disable=import-outside-toplevel

    handlers = [urllib.request.HTTPSHandler(context=context)]
    if not use_proxy:
        handlers.append(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    return urllib.request.build_opener(*handlers).open(request, timeout=timeout)


def _header_safe(text):
    text = str(text)
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return "\r" not in text and "\n" not in text and "\0" not in text


def _check_timeout(timeout):
    """The timeout as a float, or None when it is no positive, finite number of seconds."""
    if isinstance(timeout, bool):
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        return None
    return value if 0 < value and not math.isinf(value) and not math.isnan(value) else None


class OpenAIClient:
    """Talk to one OpenAI-compatible server (vLLM, SGLang).

    ``opener(method, url, data, headers, timeout)`` replaces the transport (tests); it returns a response with
    ``status``, ``read(n)`` and ``readline(n)``, or raises as ``urllib`` does (``HTTPError`` for a status >= 400).
    """

    def __init__(self, base_url, api_key=None, timeout=30.0, clock=time.monotonic, headers=None, validate_certs=True,
                 ca_path=None, client_cert=None, client_key=None, use_proxy=True, max_body_bytes=DEFAULT_MAX_BODY_BYTES,
                 opener=None):
        self.base_url = str(base_url).rstrip("/")
        self.api_key = api_key
        self.headers = dict(headers or {})
        self.last_status = None
        self.timeout = timeout
        self.clock = clock
        self.validate_certs = validate_certs
        self.ca_path = ca_path
        self.client_cert = client_cert
        self.client_key = client_key
        self.use_proxy = use_proxy
        self.max_body_bytes = max_body_bytes
        self._opener = opener or self._platform_open
        self._tls_context = None
        self._plain_context = None

    def url(self, path):
        if path.startswith("http://") or path.startswith("https://"):
            return path
        return self.base_url + "/" + path.lstrip("/")

    def _context(self, url):
        """The TLS context, built once per client (loading the system's CA bundle takes about 0.15 s, which would
        otherwise be added to every request and to the measured time to first token). Plain http needs none: an
        empty context stops ``Request`` from building one it would not use (a redirect to https then fails closed)."""
        if not url.startswith("https://"):
            if self._plain_context is None:
                self._plain_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            return self._plain_context
        if self._tls_context is None:
            tls = dict(validate_certs=self.validate_certs, client_cert=self.client_cert, client_key=self.client_key)
            if make_context is None:
                self._tls_context = _stdlib_context(ca_path=self.ca_path, **tls)
            else:
                self._tls_context = make_context(cafile=self.ca_path, **tls)
        return self._tls_context

    def _platform_open(self, method, url, data, headers, timeout):
        context = self._context(url)
        if Request is None or not REQUEST_TAKES_CONTEXT:
            return _stdlib_open(method, url, data, headers, timeout, context, use_proxy=self.use_proxy)
        return Request(timeout=timeout, http_agent=USER_AGENT, follow_redirects="safe", use_netrc=False, use_proxy=self.use_proxy,
                       context=context).open(method, url, data=data, headers=headers)

    def _request(self, url, body=None, accept="application/json"):
        """Send one request; return the open response (status < 400) or raise ``OpenAIHTTPError``."""
        headers = dict({"Accept": accept, "User-Agent": USER_AGENT}, **self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + str(self.api_key)
        for name, value in headers.items():
            if not _header_safe(name) or not _header_safe(value):
                # The value is not repeated: it may be the API key.
                raise OpenAIHTTPError("Cannot reach %s: the header %s carries a line break or a character HTTP headers cannot carry"
                                      % (url, _one_line(name, 40)), url)
        try:
            parts = urlsplit(url)
            hostname = parts.hostname
        except ValueError:
            hostname = None
        if not hostname or parts.scheme not in ("http", "https"):
            raise OpenAIHTTPError("Cannot reach %s: not an http(s) URL" % url, url)
        timeout = _check_timeout(self.timeout)
        if timeout is None:
            raise OpenAIHTTPError("Cannot reach %s: the timeout must be a positive number of seconds, not %r" % (url, self.timeout), url)
        try:
            response = self._opener("POST" if body is not None else "GET", url, data, headers, timeout)
        except HTTPError as exc:
            self.last_status = exc.code
            detail = ""
            try:
                detail = _one_line(exc.read(4096).decode("utf-8", "replace"), 200)
            except Exception:  # pylint: disable=broad-except  # the body is only a detail of the sentence
                pass
            finally:
                exc.close()
            raise OpenAIHTTPError("%s answered HTTP %s%s" % (url, exc.code, (": " + detail) if detail else ""), url, exc.code)
        except (URLError, HTTPException, UrlsConnectionError, OSError, ValueError) as exc:
            raise OpenAIHTTPError("Cannot reach %s: %s" % (url, _reason(exc)), url)
        self.last_status = getattr(response, "status", None) or response.getcode()
        return response

    def _read(self, response, url):
        """The whole body of an open response (at most ``max_body_bytes``), as text; the response is closed."""
        try:
            data = response.read(self.max_body_bytes + 1)
        except (HTTPException, OSError, ValueError) as exc:
            raise OpenAIHTTPError("Reading %s failed: %s" % (url, _reason(exc)), url)
        finally:
            response.close()
        if len(data) > self.max_body_bytes:
            raise OpenAIHTTPError("%s answered more than %d bytes (max_body_bytes)" % (url, self.max_body_bytes), url)
        return data.decode("utf-8", "replace")

    @staticmethod
    def _json(text, url):
        try:
            return json.loads(text)
        except ValueError:
            raise OpenAIHTTPError("%s did not answer JSON" % url, url)

    def get_text(self, path):
        """GET a page and return its text."""
        url = self.url(path)
        return self._read(self._request(url, accept="text/plain, */*"), url)

    def get_json(self, path):
        """GET a page and return its decoded JSON."""
        return self._json(self.get_text(path), self.url(path))

    def post_json(self, path, body):
        """POST a JSON body and return the decoded JSON answer."""
        url = self.url(path)
        return self._json(self._read(self._request(url, body), url), url)

    def _lines(self, response, url):
        """The lines of a streamed body; the whole stream is bounded by ``max_body_bytes``."""
        total = 0
        while True:
            raw = response.readline(self.max_body_bytes + 1 - total)
            if not raw:
                return
            total += len(raw)
            if total > self.max_body_bytes:
                raise OpenAIHTTPError("%s streamed more than %d bytes (max_body_bytes)" % (url, self.max_body_bytes), url)
            yield raw

    def stream_completion(self, body, path="/v1/completions"):
        """Stream a completion; return text, usage, time to first token and total latency (seconds)."""
        url = self.url(path)
        body = dict(body, stream=True)
        body.setdefault("stream_options", {"include_usage": True})
        start = self.clock()
        response = self._request(url, body, accept="text/event-stream")
        first = None
        text = []
        logprobs = []
        usage = None
        chunks = 0
        try:
            for raw in self._lines(response, url):
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise OpenAIHTTPError("%s streamed a chunk that is not JSON" % url, url)
                pieces, chunk_usage = stream_chunk(chunk, url)
                logprobs.extend(stream_logprobs(chunk))
                chunks += 1
                for piece in pieces:
                    if first is None:
                        first = self.clock()
                    text.append(piece)
                if chunk_usage:
                    usage = chunk_usage
        except (HTTPException, OSError, ValueError) as exc:
            raise OpenAIHTTPError("Streaming from %s failed: %s" % (url, _reason(exc)), url)
        finally:
            response.close()
        end = self.clock()
        if chunks == 0:
            raise OpenAIHTTPError("%s streamed no completion chunk" % url, url)
        return {
            "ttft": (first if first is not None else end) - start,
            "latency": end - start,
            "text": "".join(text),
            "usage": usage,
            "chunks": chunks,
            # The sampled tokens' log-probabilities, when the request asked for them (completions' "logprobs": N).
            "logprobs": logprobs,
        }


def _error_text(error):
    if isinstance(error, dict) and error.get("message"):
        error = error["message"]
    return _one_line(error, 200)


def stream_chunk(chunk, url=None):
    """The text pieces and the usage (or None) of one decoded stream chunk; OpenAIHTTPError when its shape is wrong."""
    where = url or "The server"
    if not isinstance(chunk, dict):
        raise OpenAIHTTPError("%s streamed a chunk that is not a JSON object" % where, url)
    if chunk.get("error"):
        raise OpenAIHTTPError("%s streamed an error: %s" % (where, _error_text(chunk["error"])), url)
    choices = chunk.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise OpenAIHTTPError("%s streamed choices that are not a list" % where, url)
    pieces = []
    for choice in choices:
        if not isinstance(choice, dict):
            raise OpenAIHTTPError("%s streamed a choice that is not a JSON object" % where, url)
        piece = choice.get("text")
        if piece is None:
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise OpenAIHTTPError("%s streamed a choice delta that is not a JSON object" % where, url)
            piece = (delta or {}).get("content")
        if piece is None:
            continue
        if not isinstance(piece, str):
            raise OpenAIHTTPError("%s streamed a choice text that is not a string" % where, url)
        pieces.append(piece)
    usage = chunk.get("usage")
    if usage is not None:
        check_usage(usage, url)
    return pieces, usage or None


def stream_logprobs(chunk):
    """The sampled tokens' log-probabilities in one stream chunk of a completion that asked for logprobs (else [])."""
    found = []
    for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if isinstance(values, list):
            found.extend(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    return found


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_usage(usage, url=None):
    """Raise OpenAIHTTPError unless ``usage`` has the OpenAI shape (token counts whole numbers, details an object)."""
    where = url or "The server"
    if not isinstance(usage, dict):
        raise OpenAIHTTPError("%s reported a usage that is not a JSON object" % where, url)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if usage.get(key) is not None and not _whole(usage[key]):
            raise OpenAIHTTPError("%s reported usage.%s that is not a whole number: %s" % (where, key, _one_line(json.dumps(usage[key]), 40)), url)
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise OpenAIHTTPError("%s reported usage.prompt_tokens_details that is not a JSON object" % where, url)
    value = (details or {}).get("cached_tokens")
    if value is not None and not _whole(value):
        raise OpenAIHTTPError("%s reported cached_tokens that is not a whole number: %s" % (where, _one_line(json.dumps(value), 40)), url)
    return usage


def model_ids(listing):
    """The model ids in a ``/v1/models`` answer (empty when it lists none or is no such answer)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def cached_tokens(usage):
    """``usage.prompt_tokens_details.cached_tokens``; None when the server does not report it as a whole number."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if _whole(value) else None
