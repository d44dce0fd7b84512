"""Runtime: member packages, request planning, backbone runners, CPU heads and answers.

This package never imports ``export`` or ``server``; both import it.
"""
