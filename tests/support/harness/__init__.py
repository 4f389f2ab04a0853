"""The test harness (not shipped: ``recipe/`` holds only what the product runs). ``tests/conftest.py`` puts
``tests/support`` on ``sys.path``; the e2e launches pass it on in ``PYTHONPATH`` (the slow tool is loaded by class
path in verl's workers)."""
