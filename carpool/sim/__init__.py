"""A deterministic simulator of carpool's scheduling, for tests and for comparing
batching policies in seconds (``carpool bench simulate``). Torch- and Redis-free
at run time; it drives carpool's own scheduling code with a fake clock.

    (arrivals: ``carpool.bench.arrivals``, shared with the bench; the one arrow
    between the two points from here to there)
    bins      an in-memory stand-in for the Redis bins (admit, peek, claim)
    engine    the event loop: workers running carpool.scheduling.scheduler.Scheduler
    summary   percentiles, throughput and batch sizes of one run
    policies  fixed windows, adaptive, adaptive with a p99 target
    compare   a sweep of loads × patterns × policies
    plots     PNG plots (matplotlib, Agg)
    cli       ``main(argv)``: the command line
"""
