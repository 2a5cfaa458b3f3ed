"""Is this request from the sender it claims to be, and what does it say?

``verifier`` checks Standard Webhooks signatures; ``schemes`` the other senders' own
(Stripe, GitHub, Shopify, Slack), ``senders`` Paddle Billing, Zoom and Linear, ``twilio``
Twilio's; ``keys`` makes a provider's dedup key (the scheme's id, a payload path or a
function); ``payload`` parses bodies and computes the fingerprint of a normalized payload that
a key is compared with. Pure functions: imports nothing of the package
but ``_exceptions``.
"""
