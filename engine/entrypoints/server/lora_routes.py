"""vLLM's runtime LoRA endpoints, on when VLLM_ALLOW_RUNTIME_LORA_UPDATING is true (else 404, as vLLM does not
register them): POST /v1/load_lora_adapter (the adapter is read and checked on the engine thread before its name is
served) and /v1/unload_lora_adapter; plain-text answers, errors in OpenAI's shape."""
from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from engine.entrypoints.server import openapi
from engine.entrypoints.server.errors import APIError, bad_request
from engine.entrypoints.server.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from engine.entrypoints.server.serving import ServerState, state_of
from engine.lora.request import LoRARequest

router = APIRouter()


RUNTIME_UPDATING = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's switch for these endpoints, honoured as vLLM does


def _check_enabled(st: ServerState) -> None:
    if os.environ.get(RUNTIME_UPDATING, "").strip().lower() not in ("1", "true"):
        raise APIError(404, f"loading and unloading LoRA adapters at runtime is off: start the server with "
                            f"{RUNTIME_UPDATING}=True (as vLLM)", code="not_found")
    if st.engine.engine.lora is None:
        raise bad_request("LoRA is not enabled on this server (start it with --enable-lora)", "lora_name")


@router.post("/v1/load_lora_adapter", response_class=Response,
             responses={**openapi.plain_text("The adapter was read, checked and is served under its name."),
                        **openapi.errors(400, 401, 413),
                        404: {"model": openapi.ErrorResponse, "description": f"{RUNTIME_UPDATING} is not set."}})
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request):
    st = state_of(request)
    _check_enabled(st)
    name = body.lora_name
    if name in st.model_names or name == st.model_path:
        raise bad_request(f"'{name}' is the base model's name", "lora_name")
    old = st.lora_modules.get(name)
    if old is not None and not body.load_inplace:
        raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    lora = LoRARequest(name, st.next_lora_id(), body.lora_path)
    try:
        await st.engine.run_on_engine_thread(lambda eng: eng.check_lora(lora))
    except ValueError as e:
        raise bad_request(str(e), "lora_path") from e
    st.lora_modules[name] = lora
    if old is not None:  # replaced: requests already running keep the old one, read again from its path if needed
        await st.engine.run_on_engine_thread(lambda eng: eng.lora.remove(old.lora_int_id))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=Response,
             responses={**openapi.plain_text("The adapter is no longer served."), **openapi.errors(400, 401, 413),
                        404: {"model": openapi.ErrorResponse, "description": f"No adapter of that name is served, or "
                                                                              f"{RUNTIME_UPDATING} is not set."}})
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request):
    st = state_of(request)
    _check_enabled(st)
    lora = st.lora_modules.get(body.lora_name)
    if lora is None or (body.lora_int_id is not None and body.lora_int_id != lora.lora_int_id):
        raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name",
                       code="not_found")
    del st.lora_modules[body.lora_name]
    await st.engine.run_on_engine_thread(lambda eng: eng.lora.remove(lora.lora_int_id))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
