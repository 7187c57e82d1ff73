"""Planning: a request turned into the runs to make, before anything starts. request.py is the request (every flag
of `run`, typed, made at the command's door), presets.py the run's presets its values override; plan.py checks the
backends, devices, strategies, options and levers against each backend's manifest and makes the `Plan` (one
`RunConfig` per run); datasets.py settles the data (the dataset and image side, with the preset and the model). Bad
input is refused here, in one line; nothing here starts a worker or writes a report."""
