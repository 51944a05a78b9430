"""The kserve client (kserve 0.21.0, in a venv of its own: its pins clash with the SDK's) against a
kiln predictor: InferenceRESTClient (protocol v2, JSON and binary tensors) and InferenceGRPCClient.
Service `scale` is the mean of 2x and 4x, so y = 3x."""

import asyncio
import os

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig
from kserve.protocol.infer_type import InferInput, InferRequest

HTTP = "http://" + os.environ["KILN_PREDICTOR_HTTP"]
GRPC = os.environ["KILN_PREDICTOR_GRPC"]
AUTH = {"Authorization": "Bearer " + os.environ["KILN_TOKEN"]}
GRPC_AUTH = (("authorization", AUTH["Authorization"]),)
MODEL = os.environ["KILN_MODEL"]

x = np.array([1.0, 2.5, -3.0], dtype=np.float64)
want = 3.0 * x


def request(binary):
    tensor = InferInput("x", list(x.shape), "FP64")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name=MODEL, infer_inputs=[tensor], request_id="kserve-1")


def parameter(response, name):
    """A reply parameter's value: plain from REST, an InferParameter message from gRPC."""
    value = response.parameters[name]
    if hasattr(value, "WhichOneof"):
        return getattr(value, value.WhichOneof("parameter_choice"))
    return value


def check(response, how):
    y = response.get_output_by_name("y").as_numpy()
    assert np.allclose(y, want), (how, y)
    assert parameter(response, "kiln.partial") is False, (how, response.parameters)
    assert parameter(response, "kiln.members_used") == 2, (how, response.parameters)


async def rest():
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        assert await client.is_server_live(HTTP)
        assert await client.is_server_ready(HTTP)
        assert await client.is_model_ready(HTTP, MODEL, headers=AUTH)
        for binary in (False, True):
            check(await client.infer(HTTP, request(binary), model_name=MODEL, headers=AUTH), f"rest binary={binary}")
        try:
            await client.infer(HTTP, request(False), model_name="nothing", headers=AUTH)
        except Exception as error:  # the client raises httpx's HTTPStatusError for a 4xx
            assert "400" in str(error) or "unknown model" in str(error), error
        else:
            raise AssertionError("an unknown model was answered")
    finally:
        await client.close()
    print("kserve rest ok")


async def grpc():
    client = InferenceGRPCClient(GRPC, retries=0, timeout=30)
    try:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready(MODEL, headers=GRPC_AUTH)
        check(await client.infer(request(False), headers=GRPC_AUTH), "grpc")
    finally:
        await client.close()
    print("kserve grpc ok")


async def main():
    await rest()
    await grpc()


asyncio.run(main())
