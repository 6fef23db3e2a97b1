"""Signing Bedrock requests: AWS Signature Version 4 with botocore's own signer, from the
standard credential chain.

The chain (environment, shared files and profiles, SSO, web identity, the ECS task or EC2
instance role) is walked once, on the first request and in a thread (it may ask the
instance metadata service); what it finds is kept. Temporary credentials are botocore's
refreshable ones: they renew themselves shortly before they expire, and only that renewal
is moved off the event loop, so no request reads a file or waits on the metadata service
otherwise. Each request is then signed over the exact bytes sent, by
``botocore.auth.SigV4Auth`` for the service ``bedrock`` in the provider's region.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import BotoCoreError

from prism import UpstreamError

__all__ = ["SIGNING_NAME", "SigV4Signer"]

SIGNING_NAME = "bedrock"  # the service name in the signature's scope (not bedrock-runtime)


class SigV4Signer:
    """Signs each request with credentials resolved once for the provider's life."""

    def __init__(self, provider: str, region: str, profile: str | None = None) -> None:
        self._provider = provider  # named in errors
        self._region = region
        self._profile = profile
        self._credentials: Credentials | None = None
        self._lock = asyncio.Lock()

    def _failed(self, why: str) -> UpstreamError:
        return UpstreamError(
            f"Provider '{self._provider}' has no usable AWS credentials: {why}.",
            code="upstream_auth_failed",
        )

    def _resolve(self) -> Credentials:
        """The credential chain's answer (blocking: run in a thread)."""
        try:
            session = botocore.session.get_session()
            if self._profile is not None:
                session.set_config_variable("profile", self._profile)
            credentials = session.get_credentials()
        except BotoCoreError as error:
            raise self._failed(str(error)) from None
        if credentials is None:
            raise self._failed("none found in the environment, the profiles or a role")
        return credentials

    async def _frozen(self) -> ReadOnlyCredentials:
        credentials = self._credentials
        if credentials is None:
            async with self._lock:
                if self._credentials is None:
                    # Not kept on failure: the next request tries again (a role may come).
                    self._credentials = await asyncio.to_thread(self._resolve)
                credentials = self._credentials
        try:
            if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
                return await asyncio.to_thread(credentials.get_frozen_credentials)
            return credentials.get_frozen_credentials()
        except BotoCoreError as error:
            raise self._failed(f"refreshing them failed ({type(error).__name__})") from None

    async def sign(self, url: str, payload: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` with the signature's own (``X-Amz-Date``, ``Authorization``, and
        ``X-Amz-Security-Token`` for temporary credentials) for a POST of ``payload`` to
        ``url`` (exactly as it will be sent)."""
        request = AWSRequest(method="POST", url=url, data=payload, headers=dict(headers))
        SigV4Auth(await self._frozen(), SIGNING_NAME, self._region).add_auth(request)
        return dict(request.headers.items())
