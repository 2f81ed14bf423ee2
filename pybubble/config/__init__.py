"""The planner's input: YAML configs read into validated dataclasses, model shapes and presets,
pybubble's JSON documents, and the argument checks every module uses."""
