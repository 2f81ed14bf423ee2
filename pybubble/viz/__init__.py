"""Pictures of a step: Chrome traces for Perfetto and Gantt charts."""
