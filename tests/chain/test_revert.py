"""Revert decoding (verde_chain/chain/revert.py): every custom error of the contracts decodes to one
name and one field list, and Error(string) / Panic / unknown data come back as named errors too."""

from __future__ import annotations

from typing import Any

from eth_abi import encode as abi_encode
from eth_utils import keccak

from verde_chain.chain.revert import _sig_type, decode_revert, error_table
from verde_chain.errors import ChainError, ContractRevert, CustomError


def test_one_selector_decodes_one_way(artifacts: Any) -> None:
    """Two errors with the same signature share a selector; the decoder keeps one entry per
    selector, so their field names must agree, or a revert would carry the other error's names."""
    fields: dict[str, set[tuple[str, ...]]] = {}
    for art in artifacts.values():
        for item in art.abi:
            if item.get("type") == "error":
                sig = f"{item['name']}({','.join(_sig_type(i) for i in item['inputs'])})"
                fields.setdefault(sig, set()).add(tuple(i["name"] for i in item["inputs"]))
    assert {sig: names for sig, names in fields.items() if len(names) > 1} == {}
    assert len(error_table(artifacts)) == len(fields)


def test_custom_errors_decode_by_name_and_fields(artifacts: Any) -> None:
    data = keccak(text="InputCountMismatch(uint256,uint256)")[:4] + abi_encode(["uint256", "uint256"], [3, 2])
    err = decode_revert(artifacts, data)
    assert isinstance(err, ContractRevert) and isinstance(err, CustomError) and isinstance(err, ChainError)
    assert err.decoded == ("InputCountMismatch", {"given": 3, "expected": 2}) and err.raw == data
    assert decode_revert(artifacts, "0x" + data.hex()).decoded == err.decoded


def test_error_string_panic_and_unknown_data(artifacts: Any) -> None:
    msg = keccak(text="Error(string)")[:4] + abi_encode(["string"], ["no"])
    assert decode_revert(artifacts, msg).decoded == ("Error", {"message": "no"})
    panic = keccak(text="Panic(uint256)")[:4] + abi_encode(["uint256"], [0x11])
    assert decode_revert(artifacts, panic).decoded == ("Panic", {"code": 0x11})
    assert decode_revert(artifacts, b"\xde\xad\xbe\xef").decoded == ("UnknownRevert", {"data": "0xdeadbeef"})
    assert decode_revert(artifacts, RuntimeError("boom")).name == "UnknownRevert"
