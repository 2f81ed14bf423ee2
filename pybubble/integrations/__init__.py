"""pybubble inside the trainers people run: :mod:`pybubble.integrations.torchtitan`. Each
integration imports its trainer only when it is used."""
