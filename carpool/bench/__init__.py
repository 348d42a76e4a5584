"""`carpool bench`: an open-loop load generator and the reports it writes.

Torch-free, like the rest of ``carpool/``. One noun per module:

    arrivals   when jobs arrive (Poisson, bursts, a trace file), seeded
    workload   what each job asks for (sizes, a unique value per job)
    records    one job's measured fate, its verification, JSON lines
    stats      percentiles, the summary of a run, the knee of a sweep (pure)
    httpclient a small asyncio HTTP/1.1 keep-alive client
    client     the async HTTP load driver (submit, then long-poll)
    direct     the worker-only driver: admit straight into Redis
    stub       a trivial job API server, for the generator's own ceiling
    ceiling    how fast the generator itself can go
    policies   the batching policies compared in one run (baselines)
    stack      private web + worker processes for one policy
    sweep      a series of rates, one summary each
    report     markdown table, JSON lines
    plots      PNG plots (matplotlib, Agg)
    cli        ``carpool bench run|sweep|drain|ceiling``
"""
