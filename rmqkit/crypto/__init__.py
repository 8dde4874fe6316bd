"""Field-level encryption of personal data in message bodies (issue 16; docs/encryption.md).

- ``KeyRing``: AES-256 keys by id, the current one, and a separate blind-index key; loaded
  with ``load_keyring(file, inline)`` / ``keyring_from_env()`` (``RMQKIT_KEYRING_FILE`` or
  ``RMQKIT_KEYRING``); written by ``generate`` / ``rotate`` / ``activate`` (mode 0600).
- ``encrypt_fields`` / ``decrypt_fields`` / ``redact_fields`` on a JSON body (bytes or parsed),
  by field path (``customer.name``, ``items[].card``: rmqkit.crypto.paths); ``shape_problem``
  says why a body could hold a field where its path does not reach (refused: DataError);
  ``Undecryptable`` (a DataError) names the path and the reason.
- ``blind_index`` and ``Matcher``: equality search without decrypting.
- ``Sensitive`` (``rmqkit.Sensitive``): marks a pydantic model's field sensitive;
  ``sensitive_fields(Model)`` lists the marked fields as paths (rmqkit.crypto.model).
"""

from __future__ import annotations

from rmqkit.crypto.envelope import MARKER, blind_index, is_envelope
from rmqkit.crypto.errors import KeyRingError, Undecryptable
from rmqkit.crypto.fields import (
    Matcher,
    check_paths,
    decrypt_fields,
    encrypt_fields,
    find_field,
    leaves,
    redact_fields,
    shape_problem,
)
from rmqkit.crypto.keyfile import activate, generate, rotate
from rmqkit.crypto.keyring import (
    ENV_FILE,
    ENV_INLINE,
    Key,
    KeyRing,
    generate_keyring,
    keyring_from_env,
    load_keyring,
    load_keyring_file,
    parse_keyring,
)
from rmqkit.crypto.model import Sensitive, sensitive_fields

__all__ = [
    "ENV_FILE",
    "ENV_INLINE",
    "MARKER",
    "Key",
    "KeyRing",
    "KeyRingError",
    "Matcher",
    "Sensitive",
    "Undecryptable",
    "activate",
    "blind_index",
    "check_paths",
    "decrypt_fields",
    "encrypt_fields",
    "find_field",
    "generate",
    "generate_keyring",
    "is_envelope",
    "keyring_from_env",
    "leaves",
    "load_keyring",
    "load_keyring_file",
    "parse_keyring",
    "redact_fields",
    "rotate",
    "sensitive_fields",
    "shape_problem",
]
