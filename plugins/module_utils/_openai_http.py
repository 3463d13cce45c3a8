# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A small OpenAI-compatible HTTP client on http.client (pure Python, no Ansible, no third-party library).

Enough for the checks: GET a text page (``/metrics``), POST JSON (``/tokenize``) and stream a completion while
timing the first token. Every failure is an ``OpenAIHTTPError`` whose ``str()`` is one sentence.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import socket
import time

try:  # Python 3
    from http.client import HTTPConnection, HTTPException, HTTPSConnection
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover - Python 2 is not supported by the collection
    HTTPConnection = HTTPSConnection = HTTPException = urlsplit = None


class OpenAIHTTPError(Exception):
    """A request failed; ``str(exc)`` is one sentence, ``status`` the HTTP status when there was one."""

    def __init__(self, message, url=None, status=None):
        super(OpenAIHTTPError, self).__init__(message)
        self.url = url
        self.status = status


def _connect(scheme, host, port, timeout):
    if scheme == "https":
        return HTTPSConnection(host, port, timeout=timeout)
    return HTTPConnection(host, port, timeout=timeout)


def _reason(exc):
    reason = getattr(exc, "reason", None) or exc
    return str(reason).rstrip(".")


class OpenAIClient:
    """Talk to one OpenAI-compatible server (vLLM, SGLang)."""

    def __init__(self, base_url, api_key=None, timeout=30.0, clock=time.monotonic, connect=None, headers=None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.headers = dict(headers or {})
        self.last_status = None
        self.timeout = timeout
        self.clock = clock
        self._connect = connect or _connect

    def url(self, path):
        if path.startswith("http://") or path.startswith("https://"):
            return path
        return self.base_url + "/" + path.lstrip("/")

    def _request(self, url, body=None, accept="application/json"):
        """Send one request; return the open response (status < 400) or raise ``OpenAIHTTPError``."""
        headers = dict({"Accept": accept, "User-Agent": "inference_cache.substrate"}, **self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OpenAIHTTPError("Cannot reach %s: not an http(s) URL" % url, url)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        try:
            connection = self._connect(parts.scheme, parts.hostname, parts.port, self.timeout)
            connection.request("POST" if body is not None else "GET", target, body=data, headers=headers)
            response = connection.getresponse()
        except (HTTPException, socket.timeout, OSError, ValueError) as exc:
            raise OpenAIHTTPError("Cannot reach %s: %s" % (url, _reason(exc)), url)
        self.last_status = response.status
        if response.status >= 400:
            detail = ""
            try:
                detail = response.read().decode("utf-8", "replace").strip().replace("\n", " ")[:200]
            except (HTTPException, socket.timeout, OSError):
                pass
            finally:
                response.close()
            raise OpenAIHTTPError("%s answered HTTP %s%s" % (url, response.status, (": " + detail) if detail else ""), url, response.status)
        return response

    @staticmethod
    def _read(response, url):
        """The whole body of an open response, as text; the response is closed."""
        try:
            return response.read().decode("utf-8", "replace")
        except (HTTPException, socket.timeout, OSError) as exc:
            raise OpenAIHTTPError("Reading %s failed: %s" % (url, _reason(exc)), url)
        finally:
            response.close()

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

    def stream_completion(self, body, path="/v1/completions"):
        """Stream a completion; return text, usage, time to first token and total latency (seconds)."""
        url = self.url(path)
        body = dict(body, stream=True)
        body.setdefault("stream_options", {"include_usage": True})
        start = self.clock()
        response = self._request(url, body, accept="text/event-stream")
        first = None
        text = []
        usage = None
        chunks = 0
        try:
            for raw in response:
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
                if chunk.get("error"):
                    raise OpenAIHTTPError("%s streamed an error: %s" % (url, chunk["error"]), url)
                chunks += 1
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text")
                    if piece is None:
                        piece = (choice.get("delta") or {}).get("content")
                    if piece is not None:
                        if first is None:
                            first = self.clock()
                        text.append(piece)
                if chunk.get("usage"):
                    usage = chunk["usage"]
        except (HTTPException, socket.timeout, OSError) as exc:
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
        }


def model_ids(listing):
    """The model ids in a ``/v1/models`` answer (empty when it lists none or is no such answer)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    return [m["id"] for m in data or [] if isinstance(m, dict) and m.get("id")]


def cached_tokens(usage):
    """``usage.prompt_tokens_details.cached_tokens`` or None when the server does not report it."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return int(value) if value is not None else None
