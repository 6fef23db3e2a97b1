"""The local provider's Gemini API, checked with Google's own client (``google-genai``)
pointed at it: if the stand-in drifted from the real wire format, the client would fail
to parse it (answers, streams, calls, embeddings, the model list, errors)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google import genai
from google.genai import errors, types

from deploy.local.provider import ProviderServer, ProviderSettings

MODEL = "gemini-2.5-flash"
NO_RETRY = types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1))


def client(url: str, key: str = "gemini-test-key", version: str = "v1beta") -> genai.Client:
    options = types.HttpOptions(base_url=url, api_version=version)
    return genai.Client(api_key=key, http_options=options)


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_generate_content_parses_text_usage_and_finish(
    provider: ProviderServer, version: str
) -> None:
    config = types.GenerateContentConfig(
        system_instruction="Be brief.", temperature=0, max_output_tokens=64, stop_sequences=["X"]
    )
    gemini = client(provider.url, version=version)  # kept: a dropped client closes itself
    answer = gemini.models.generate_content(
        model=MODEL, contents="Name a prime number.", config=config
    )
    assert answer.text is not None and answer.text.startswith("Echo: Name a prime number.")
    assert answer.candidates is not None
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    usage = answer.usage_metadata
    assert usage is not None and usage.prompt_token_count and usage.candidates_token_count
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    (sent,) = provider.control.requests()
    assert sent["path"] == f"/{version}/models/{MODEL}:generateContent"
    assert sent["headers"]["x-goog-api-key"] == "gemini-test-key"
    assert sent["body"]["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert sent["body"]["generationConfig"]["maxOutputTokens"] == 64


def test_generate_content_stream_parses_every_event(provider: ProviderServer) -> None:
    gemini = client(provider.url)
    whole = gemini.models.generate_content(model=MODEL, contents="Stream me, please.")
    chunks = list(gemini.models.generate_content_stream(model=MODEL, contents="Stream me, please."))
    assert len(chunks) > 2
    assert "".join(c.text or "" for c in chunks) == whole.text
    last = chunks[-1]
    assert last.candidates is not None and last.candidates[0].finish_reason == "STOP"
    assert last.usage_metadata is not None
    assert last.usage_metadata.total_token_count == whole.usage_metadata.total_token_count  # type: ignore[union-attr]
    assert all(c.candidates and c.candidates[0].finish_reason is None for c in chunks[:-1])
    assert provider.control.requests()[-1]["query"] == "alt=sse"


def test_a_forced_function_call_parses_and_a_call_loop_completes(provider: ProviderServer) -> None:
    gemini = client(provider.url)
    forced = types.GenerateContentConfig(
        tools=[get_weather],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(
                mode=types.FunctionCallingConfigMode.ANY
            )
        ),
    )
    answer = gemini.models.generate_content(model=MODEL, contents="Weather in Pune?", config=forced)
    (call,) = answer.function_calls or []
    assert call.name == "get_weather" and isinstance(call.args, dict) and "city" in call.args
    # The client's own loop: it runs the function, sends the call (its signature kept)
    # and the response back, and the stand-in accepts the history and answers in text.
    looped = gemini.models.generate_content(
        model="gemini-3-flash",
        contents="get_weather for Pune?",
        config=types.GenerateContentConfig(tools=[get_weather]),
    )
    assert looped.text is not None and looped.text.startswith("Echo:")
    history = looped.automatic_function_calling_history or []
    assert [c.role for c in history] == ["user", "model", "user"]
    sent = provider.control.requests()[-1]["body"]["contents"]
    assert sent[1]["parts"][0]["thoughtSignature"] == "c2lnbmF0dXJl"
    assert sent[2]["parts"][0]["functionResponse"]["name"] == "get_weather"


def test_embed_content_and_the_model_list(provider: ProviderServer) -> None:
    gemini = client(provider.url)
    config = types.EmbedContentConfig(output_dimensionality=4)
    texts = [types.Content(parts=[types.Part(text=text)]) for text in ("alpha", "beta")]
    result = gemini.models.embed_content(
        model="gemini-embedding-001", contents=texts, config=config
    )
    vectors = [e.values for e in result.embeddings or []]
    assert len(vectors) == 2 and all(v is not None and len(v) == 4 for v in vectors)
    assert vectors[0] != vectors[1]
    names = [m.name for m in gemini.models.list()]
    assert "models/gemini-2.5-flash" in names and "models/gemini-embedding-001" in names


def test_errors_parse_as_the_clients_own(
    provider: ProviderServer, provider_factory: Callable[[ProviderSettings], ProviderServer]
) -> None:
    gemini = client(provider.url)
    provider.control.set_fault("rate_limit", retry_after=3)
    with pytest.raises(errors.ClientError) as limited:
        gemini.models.generate_content(
            model=MODEL, contents="x", config=types.GenerateContentConfig(http_options=NO_RETRY)
        )
    assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert "retryDelay" in str(limited.value.details)
    provider.control.set_fault("status", status=503, message="The model is overloaded.")
    with pytest.raises(errors.ServerError) as unavailable:
        gemini.models.generate_content(
            model=MODEL, contents="x", config=types.GenerateContentConfig(http_options=NO_RETRY)
        )
    assert (unavailable.value.code, unavailable.value.status) == (503, "UNAVAILABLE")
    assert unavailable.value.message == "The model is overloaded."
    keyed = provider_factory(ProviderSettings(api_key="right-key"))
    wrong = client(keyed.url, key="wrong-key")
    with pytest.raises(errors.ClientError) as bad_key:
        wrong.models.generate_content(model=MODEL, contents="x")
    assert (bad_key.value.code, bad_key.value.status) == (400, "INVALID_ARGUMENT")
    assert "API_KEY_INVALID" in str(bad_key.value.details)
    with pytest.raises(errors.ClientError) as bad_role:
        gemini.models.generate_content(
            model=MODEL, contents=[types.Content(role="assistant", parts=[types.Part(text="x")])]
        )
    assert bad_role.value.message == "Please use a valid role: user, model."
