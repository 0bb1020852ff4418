"""Browser engines driven from the host, one driver per engine over its own transport:
Chromium over CDP (:mod:`rigd.browser.chromium`, client :mod:`rigd.browser.cdp`), Firefox ESR
over WebDriver BiDi (:mod:`rigd.browser.firefox`), WebKitGTK over WebDriver classic
(:mod:`rigd.browser.webkit`, client :mod:`rigd.browser.webdriver`); with what they share
(page scripts in :mod:`rigd.browser.page`, profiles, key maps, a person's live input)."""
