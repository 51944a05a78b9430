"""The models of the serving benchmark (issue 16), shared by kiln's workers and Ray Serve's
replicas so that both sides compute the same thing:

    noop     load() -> None;  predict: {"y": x} (identity)
    digits   load(path) -> an SVC (probability=True, gamma=0.001) fitted on scikit-learn's bundled
             digits (1,797 8x8 images), or path/model.pkl when there is one;
             predict: x FP64 [batch, 64] -> {"probabilities": FP64 [batch, 10]}

    python bench/serve_workers.py MODEL               # a kiln worker on 127.0.0.1:$KILN_SERVE_PORT
    python bench/serve_workers.py digits --save DIR   # writes DIR/model.pkl and exits

`request(model)` is the Open Inference Protocol (v2, JSON) body both sides are sent: one digits
image as x FP64 [1, 64]. `decode` and `encode` are kiln.serve's own codec, so a Ray Serve
replica parses and writes the same JSON as a kiln worker does.
"""

import argparse
import json
import os
import pickle
import sys
import warnings

import numpy as np

MODELS = ("noop", "digits")


# === noop ===


def noop_load(path=None):
    return None


def noop_predict(model, inputs):
    return {"y": inputs["x"]}


# === digits ===


def digits_train():
    """An SVC with Platt-scaled probabilities on the digits set: about a second to fit here."""
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    x, y = load_digits(return_X_y=True)
    with warnings.catch_warnings():
        # scikit-learn 1.9 deprecates probability=True (removal in 1.11); the bench pins 1.9.1.
        warnings.simplefilter("ignore", FutureWarning)
        model = SVC(probability=True, gamma=0.001, random_state=0)
        model.fit(x, y)
    return model


def digits_load(path=None):
    if path and os.path.isfile(os.path.join(path, "model.pkl")):
        with open(os.path.join(path, "model.pkl"), "rb") as f:
            return pickle.load(f)
    return digits_train()


def digits_predict(model, inputs):
    return {"probabilities": model.predict_proba(np.asarray(inputs["x"], dtype=np.float64))}


LOAD = {"noop": noop_load, "digits": digits_load}
PREDICT = {"noop": noop_predict, "digits": digits_predict}


# === the request and the codec ===


def digits_row(index=0):
    """One digits image as FP64 [1, 64] (pixel values 0..16)."""
    from sklearn.datasets import load_digits

    return load_digits().data[index:index + 1].astype(np.float64)


def request(model=None, index=0):
    """The OIP JSON request both sides get (for either model): {"inputs": [x FP64 [1, 64]]}."""
    row = digits_row(index)
    return {"inputs": [{"name": "x", "shape": list(row.shape), "datatype": "FP64", "data": row.ravel().tolist()}]}


def request_body(model=None, index=0) -> bytes:
    return json.dumps(request(model, index), separators=(",", ":")).encode()


def _codec():
    from kiln import _serve  # the SDK's codec: `pip install sdk/python` into the bench venv

    return _serve


def decode(body: bytes) -> dict:
    """Inputs by name (numpy arrays) from an OIP JSON body, as kiln.serve reads them; raises
    ValueError on a body it refuses."""
    codec = _codec()
    try:
        inputs, _, _ = codec.decode_request(body, np)
    except codec._Refused as refused:
        raise ValueError(str(refused)) from None
    return inputs


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode(model_name: str, outputs: dict) -> bytes:
    """An OIP JSON response body, as kiln.serve writes it."""
    codec = _codec()
    tensors = [codec.encode_output(str(name), value, np) for name, value in outputs.items()]
    answer = {"model_name": model_name, "outputs": tensors}
    return _ENCODER.encode(answer).encode()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--save", metavar="DIR", help="write DIR/model.pkl (digits) and exit")
    args = parser.parse_args(argv)
    if args.save and args.model != "digits":
        parser.error("--save is for digits (noop has no model)")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        with open(os.path.join(args.save, "model.pkl"), "wb") as f:
            pickle.dump(LOAD[args.model](None), f)
        return 0
    import kiln

    kiln.serve(PREDICT[args.model], LOAD[args.model])
    return 0


if __name__ == "__main__":
    sys.exit(main())
