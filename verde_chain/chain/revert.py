"""Decode Solidity custom errors (and Error(string)/Panic) into ``ContractRevert``: name and fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from verde_chain.chain.compile import Artifact
from verde_chain.errors import ContractRevert

_ERROR_STRING = keccak(text="Error(string)")[:4]
_PANIC = keccak(text="Panic(uint256)")[:4]


def _sig_type(inp: dict[str, Any]) -> str:
    t = inp["type"]
    if t.startswith("tuple"):
        inner = ",".join(_sig_type(c) for c in inp["components"])
        return f"({inner}){t[5:]}"
    return str(t)


def error_table(artifacts: Mapping[str, Artifact]) -> dict[bytes, tuple[str, list[dict[str, Any]]]]:
    table: dict[bytes, tuple[str, list[dict[str, Any]]]] = {}
    for art in artifacts.values():
        for item in art.abi:
            if item.get("type") == "error":
                sig = f"{item['name']}({','.join(_sig_type(i) for i in item['inputs'])})"
                table[keccak(text=sig)[:4]] = (item["name"], item["inputs"])
    return table


def revert_data(exc_or_data: Any) -> bytes | None:
    """Pull the raw revert bytes out of whatever web3 raised (or pass bytes/hex through)."""
    if isinstance(exc_or_data, (bytes, bytearray)):
        return bytes(exc_or_data)
    if isinstance(exc_or_data, str):
        return bytes.fromhex(exc_or_data.removeprefix("0x"))
    data = getattr(exc_or_data, "data", None)
    if isinstance(data, str) and data.startswith("0x"):
        return bytes.fromhex(data[2:])
    if isinstance(data, dict):
        inner = data.get("data")
        if isinstance(inner, str) and inner.startswith("0x"):
            return bytes.fromhex(inner[2:])
    for arg in getattr(exc_or_data, "args", ()):
        if isinstance(arg, str) and arg.startswith("0x"):
            try:
                return bytes.fromhex(arg[2:])
            except ValueError:
                continue
        if isinstance(arg, dict) and isinstance(arg.get("data"), str):
            return bytes.fromhex(arg["data"].removeprefix("0x"))
    return None


def decode_revert(artifacts: Mapping[str, Artifact], exc_or_data: Any) -> ContractRevert:
    raw = revert_data(exc_or_data)
    if raw is None:
        return ContractRevert("UnknownRevert", message=str(exc_or_data))
    sel, body = raw[:4], raw[4:]
    if sel == _ERROR_STRING:
        return ContractRevert("Error", raw=raw, message=abi_decode(["string"], body)[0])
    if sel == _PANIC:
        return ContractRevert("Panic", raw=raw, code=abi_decode(["uint256"], body)[0])
    entry = error_table(artifacts).get(sel)
    if entry is None:
        return ContractRevert("UnknownRevert", raw=raw, data="0x" + raw.hex())
    name, inputs = entry
    decoded = abi_decode([_sig_type(i) for i in inputs], body)
    # eth_abi gives lowercase hex; users compare with checksummed account addresses.
    values = [to_checksum_address(v) if i["type"] == "address" else v for i, v in zip(inputs, decoded, strict=True)]
    fields = {i["name"] or f"arg{n}": v for n, (i, v) in enumerate(zip(inputs, values))}
    return ContractRevert(name, raw=raw, **fields)
