"""Real Open Inference Protocol clients against a kiln predictor: tritonclient.http (JSON and
binary tensors) and tritonclient.grpc. Service `scale` is the mean of 2x and 4x, so y = 3x."""

import os

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

HTTP = os.environ["KILN_PREDICTOR_HTTP"]
GRPC = os.environ["KILN_PREDICTOR_GRPC"]
AUTH = {"Authorization": "Bearer " + os.environ["KILN_TOKEN"]}
# gRPC metadata keys must be lowercase (grpcio refuses the call otherwise).
GRPC_AUTH = {"authorization": AUTH["Authorization"]}
MODEL = os.environ["KILN_MODEL"]

x = np.array([1.0, 2.5, -3.0], dtype=np.float64)
want = 3.0 * x


def refused(call, status, *fragments):
    """Asserts `call()` raises InferenceServerException with `status` and the fragments."""
    try:
        call()
    except InferenceServerException as error:
        assert error.status() == status, (error.status(), error.message())
        for fragment in fragments:
            assert fragment in error.message(), (fragment, error.message())
        return error
    raise AssertionError(f"not refused: {call}")


# --- tritonclient.http ---
rest = httpclient.InferenceServerClient(url=HTTP)
assert rest.is_server_live()
assert rest.is_server_ready()
assert rest.is_model_ready(MODEL, headers=AUTH)
assert not rest.is_model_ready("nothing", headers=AUTH)
assert rest.get_server_metadata(headers=AUTH)["name"] == "kiln"
metadata = rest.get_model_metadata(MODEL, headers=AUTH)
assert metadata["name"] == MODEL and metadata["versions"] == ["1"], metadata
assert metadata["inputs"] == [{"name": "x", "datatype": "FP64", "shape": [-1]}], metadata

for binary in (False, True):
    tensor = httpclient.InferInput("x", list(x.shape), "FP64")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = rest.infer(
        MODEL,
        [tensor],
        outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)],
        request_id=f"rest-{binary}",
        headers=AUTH,
    )
    np.testing.assert_array_equal(result.as_numpy("y"), want)
    response = result.get_response()
    assert response["id"] == f"rest-{binary}", response
    assert response["model_version"] == "1", response
    assert response["parameters"]["kiln.partial"] is False, response
    assert response["parameters"]["kiln.members_used"] == 2, response
    # Binary outputs come in the binary part, JSON ones in the JSON.
    assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) == binary, response

tensor = httpclient.InferInput("x", [2], "FP64")
tensor.set_data_from_numpy(np.array([1.0, 2.0]))
refused(lambda: rest.infer("nothing", [tensor], headers=AUTH), "400", "unknown model `nothing`")
wrong = httpclient.InferInput("x", [2], "INT32")
wrong.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
refused(lambda: rest.infer(MODEL, [wrong], headers=AUTH), "400", "input `x` is INT32 [2]", "takes FP64 [-1]")
refused(lambda: rest.infer(MODEL, [tensor]), "401", "missing bearer token")
print("tritonclient.http ok")

# --- tritonclient.grpc ---
channel = grpcclient.InferenceServerClient(url=GRPC)
assert channel.is_server_live()
assert channel.is_server_ready()
assert channel.is_model_ready(MODEL, headers=GRPC_AUTH)
assert channel.get_server_metadata(headers=GRPC_AUTH).name == "kiln"
metadata = channel.get_model_metadata(MODEL, headers=GRPC_AUTH, as_json=True)
assert metadata["name"] == MODEL and metadata["versions"] == ["1"], metadata
assert metadata["inputs"] == [{"name": "x", "datatype": "FP64", "shape": ["-1"]}], metadata
config = channel.get_model_config(MODEL, headers=GRPC_AUTH).config
assert config.name == MODEL and config.max_batch_size == 0, config
assert config.input[0].name == "x" and list(config.input[0].dims) == [-1], config
assert config.input[0].data_type == grpcclient.model_config_pb2.TYPE_FP64, config

tensor = grpcclient.InferInput("x", list(x.shape), "FP64")
tensor.set_data_from_numpy(x)
result = channel.infer(
    MODEL,
    [tensor],
    outputs=[grpcclient.InferRequestedOutput("y")],
    request_id="grpc-1",
    headers=GRPC_AUTH,
    timeout=5_000_000,
)
np.testing.assert_array_equal(result.as_numpy("y"), want)
response = result.get_response()
assert response.id == "grpc-1" and response.model_version == "1", response
assert response.parameters["kiln.partial"].bool_param is False, response
assert response.parameters["kiln.members_used"].int64_param == 2, response
assert response.parameters["kiln.members"].int64_param == 2, response
assert "kiln.missing" not in response.parameters, response

# Several inputs' worth of work in one channel, and BYTES-free numbers of another type.
batch = np.arange(12, dtype=np.float64).reshape(12)
tensor = grpcclient.InferInput("x", [12], "FP64")
tensor.set_data_from_numpy(batch)
np.testing.assert_array_equal(channel.infer(MODEL, [tensor], headers=GRPC_AUTH).as_numpy("y"), 3.0 * batch)

refused(lambda: channel.infer("nothing", [tensor], headers=GRPC_AUTH), "StatusCode.INVALID_ARGUMENT", "unknown model `nothing`")
wrong = grpcclient.InferInput("x", [2], "INT32")
wrong.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
refused(
    lambda: channel.infer(MODEL, [wrong], headers=GRPC_AUTH),
    "StatusCode.INVALID_ARGUMENT",
    "input `x` is INT32 [2]",
    "takes FP64 [-1]",
)
refused(lambda: channel.infer(MODEL, [tensor]), "StatusCode.UNAUTHENTICATED", "missing bearer token")
refused(lambda: channel.get_model_metadata("nothing", headers=GRPC_AUTH), "StatusCode.INVALID_ARGUMENT", "unknown model")
refused(
    lambda: channel.get_inference_statistics(MODEL, headers=GRPC_AUTH),
    "StatusCode.UNIMPLEMENTED",
    "no per-model statistics",
)
print("tritonclient.grpc ok")
