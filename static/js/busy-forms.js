// A form marked data-busy says it is working once submitted: its submit button is disabled
// (no second request) and its [data-busy-message] element shows until the next page arrives.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-busy")) return;
  for (const button of form.querySelectorAll("button[type=submit]")) {
    button.disabled = true;
  }
  const message = form.querySelector("[data-busy-message]");
  if (message) message.hidden = false;
});
