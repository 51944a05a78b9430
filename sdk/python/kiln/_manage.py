"""The stubs `kiln.Client`'s sweeps, models, services and tokens call, on channels opened on
first use: the api (ModelService, UserService, ArtifactService for code uploads), the advisor
(SweepService) and the predictor (ServeService), found as every other service is (KILN_*_ADDR,
the credentials file, else the api's DiscoveryService; see kiln._run._service_address). A
client that never drives a sweep never asks where the advisor is."""

from __future__ import annotations

from typing import NamedTuple

import grpc

from kiln.v1 import artifact_pb2_grpc, model_pb2_grpc, serve_pb2_grpc, sweep_pb2_grpc, tenancy_pb2_grpc



class ManageStubs(NamedTuple):
    """The api's ArtifactService, ModelService and UserService, the advisor's SweepService and
    the predictor's ServeService."""

    artifacts: artifact_pb2_grpc.ArtifactServiceStub
    models: model_pb2_grpc.ModelServiceStub
    users: tenancy_pb2_grpc.UserServiceStub
    sweeps: sweep_pb2_grpc.SweepServiceStub
    serve: serve_pb2_grpc.ServeServiceStub


class ManageChannels:
    """Opens the channels of `ManageStubs` on first use and closes them with the client."""

    def __init__(self, api_address: str, token: str):
        self._api_address = api_address
        self._token = token
        self._channels: list[grpc.Channel] = []
        self._stubs: ManageStubs | None = None

    def stubs(self) -> ManageStubs:
        from ._run import _channel, _service_address

        if self._stubs is None:
            api = _channel(self._api_address)
            self._channels.append(api)

            def channel_of(service: str) -> grpc.Channel:
                address = _service_address(service, self._api_address, self._token)
                if address == self._api_address:
                    return api
                opened = _channel(address)
                self._channels.append(opened)
                return opened

            self._stubs = ManageStubs(
                artifacts=artifact_pb2_grpc.ArtifactServiceStub(api), models=model_pb2_grpc.ModelServiceStub(api),
                users=tenancy_pb2_grpc.UserServiceStub(api),
                sweeps=sweep_pb2_grpc.SweepServiceStub(channel_of("advisor")),
                serve=serve_pb2_grpc.ServeServiceStub(channel_of("predictor")),
            )
        return self._stubs

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels = []
        self._stubs = None


__all__ = ["ManageChannels", "ManageStubs"]
