"""Two ports every local Ray takes from the whole machine, which the suite's clusters — several at once, beside its
background work (tests/background.py) — take from the system instead: the dashboard agent's HTTP port (Ray's default,
52365: the agent of a second Ray serves no HTTP, so no Jobs API for that cluster, whose job submissions then wait for
ever; ``ray.cluster_utils`` and Ray's fake multi-node provider start theirs on the system's choice) and the dashboard's
(8265: two Rays started at once may both take it, and a job meant for one runs on the other). For the clusters a test
process starts itself (``ray.init(address="local")``); ``proxray``'s own commands, run as users run them, keep Ray's."""


def take_ray_ports_from_the_system() -> None:
    from ray._private import parameter, ray_constants

    from proxray.serve.front import free_port

    init = parameter.RayParams.__init__
    names = init.__code__.co_varnames[:init.__code__.co_argcount]
    defaults = list(init.__defaults__)
    at = names.index("dashboard_agent_listen_port") - (len(names) - len(defaults))
    defaults[at] = 0  # 0: the system's choice (ray/dashboard/agent.py reads the port it bound)
    init.__defaults__ = tuple(defaults)
    ray_constants.DEFAULT_DASHBOARD_PORT = free_port()  # where a dashboard of no named port starts looking
