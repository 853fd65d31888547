"""Intervention devices behind one interface: SpaceMouse, gamepad, keyboard, and the
scripted expert standing in for a human in sim."""
