"""Browser engines driven from the host, one driver per engine over its own transport:
Chromium over CDP (:mod:`rigd.browser.chromium`, client :mod:`rigd.browser.cdp`), Firefox ESR
over WebDriver BiDi (:mod:`rigd.browser.firefox`), WebKitGTK over WebDriver classic
(:mod:`rigd.browser.webkit`, client :mod:`rigd.browser.webdriver`); each over the verbs
written once (:mod:`rigd.browser.driver` for every engine, :mod:`rigd.browser.w3c` for the two
W3C-actions engines) and what they share (page scripts in :mod:`rigd.browser.page`, profiles,
key maps, a person's live input)."""
