"""The pipeline that an open ``dflow serve`` of the security tests offers (it imports this
module); no worker serves it: runs are only created."""

from dflow import DFlow

rv_serve_echo = DFlow.from_call("rv-serve-echo").map(lambda x: {"echo": x}).id("wrap").init("rv-serve-echo")
