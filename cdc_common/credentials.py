"""Where each cloud's credentials come from: the environment variable names, written once.

- Alibaba Cloud (the Tablestore tunnel client, the Tablestore meta store, the source's options):
  ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` and, for STS,
  ``ALIBABA_CLOUD_SECURITY_TOKEN``, used where no credential is passed in (``alibaba_credentials``).
- AWS (the DynamoDB meta store and the DynamoDB Streams tunnel): botocore's own credential chain;
  the names here are only what messages tell a user to set.

Credentials never belong in a URI that is shown or stored (``cdc_common.uris``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ALIBABA_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ALIBABA_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ALIBABA_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"
#: every Alibaba Cloud credential variable, in the order above
ALIBABA_ENV = (ALIBABA_ACCESS_KEY_ID, ALIBABA_ACCESS_KEY_SECRET, ALIBABA_SECURITY_TOKEN)

AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
#: where AWS credentials come from, as messages name it
AWS_CREDENTIAL_CHAIN = (f"the standard AWS chain ({AWS_ACCESS_KEY_ID}/{AWS_SECRET_ACCESS_KEY}, "
                        "profile=NAME, an instance or task role)")


@dataclass(frozen=True)
class AlibabaCredentials:
    """An AccessKey pair and an optional STS token; the secret parts never appear in ``repr``."""

    access_key_id: str | None
    access_key_secret: str | None = field(default=None, repr=False)
    security_token: str | None = field(default=None, repr=False)

    @property
    def complete(self) -> bool:
        """Both parts of the AccessKey pair are there (the token is optional)."""
        return bool(self.access_key_id and self.access_key_secret)


def alibaba_credentials(access_key_id: str | None = None, access_key_secret: str | None = None,
                        security_token: str | None = None) -> AlibabaCredentials:
    """Each value passed in, else its environment variable in this process (empty = none)."""
    return AlibabaCredentials(
        access_key_id or os.environ.get(ALIBABA_ACCESS_KEY_ID) or None,
        access_key_secret or os.environ.get(ALIBABA_ACCESS_KEY_SECRET) or None,
        security_token or os.environ.get(ALIBABA_SECURITY_TOKEN) or None,
    )
