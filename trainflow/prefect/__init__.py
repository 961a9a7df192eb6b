"""The Prefect adapter: the only library code that talks to Prefect, besides the flows, the tasks and
the command line that use it.

What a person sees of a run in Prefect (`ui`: the progress and summary artifacts, the events;
`verdicts`: a drill's, soak's or rerun's verdict; `attempt_states`: a failed attempt's task drawn
failed; `output_tail`: a sampled tail of the training output in the flow run's logs), the
automation that notifies on failure (`automation`), the server's global concurrency limits that
hold team quotas (`concurrency_limits`), read-only REST calls that need no Prefect client (`rest`),
the temporary server of one `trainflow` command (`server`), and the records the lifecycle's tasks
hand each other (`records`).
"""
