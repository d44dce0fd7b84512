"""OmniJev-4B v1.1: one image and Noul, Choice or Score questions, answered in one prefill.

One module per concern: ``contract`` (the request), ``image`` (decode and preprocess), ``layout``
(prompt, tokens, shared prefix, rows, positions), ``vision`` (the tower), ``features`` (the LM
log-probability features), ``heads``, ``finish`` (calibration and answers), ``package`` (the gate),
``model`` (the DecisionModel that ties them together) and ``engine`` (that model from an engine
directory). The reference is ``tinnel123666888/OmniJev@14dbec4`` (``MSO1.ask_branch``) as ported
by ``ThinkFlowLab/system1-omni:src/models/omnijev/native/``.
"""
