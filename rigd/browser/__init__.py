"""Browser engines driven from the host: the CDP client (:mod:`rigd.browser.cdp`) and the
Chromium driver of the browser_use verbs (:mod:`rigd.browser.chromium`)."""
