"""Everything that runs inside a training job: model, upcycling methods, schedule, data, engine, checkpoints."""
